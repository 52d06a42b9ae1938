// PeriodicService: runs one maintenance task on its own thread and connection while this node
// leads: at start, then every interval, until stopped. A failing tick is logged once per state
// change and retried on the next tick; it never stops the service.
//
// Thread-safety: start()/stop() from one owner thread; the task runs on the service's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/observer.h"

namespace baton::worker {

class PeriodicService {
 public:
  using Task = std::function<void(pqxx::connection& conn, std::int64_t epoch)>;

  PeriodicService(std::string name, detail::ConnectOptions connect, Millis interval, Task task);
  ~PeriodicService();
  PeriodicService(const PeriodicService&) = delete;
  PeriodicService& operator=(const PeriodicService&) = delete;

  void start(std::int64_t epoch);
  void stop();  // returns once the task is not running and will not run again
  // Counts the task's failures (set before start()).
  void set_error_observer(detail::ErrorObserver* observer) { errors_ = observer; }
  // Waits at least `factor` times the last run's duration between runs (0: the interval only),
  // so that an expensive task keeps its share of the database bounded (set before start()).
  void set_cost_factor(int factor) { cost_factor_ = factor; }

 private:
  void loop(std::int64_t epoch);

  const std::string name_;
  const detail::ConnectOptions connect_;
  const Millis interval_;
  const Task task_;
  detail::ErrorObserver* errors_ = nullptr;
  int cost_factor_ = 0;
  std::unique_ptr<pqxx::connection> conn_;  // used by the service thread only
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace baton::worker
