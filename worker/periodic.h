// PeriodicService: runs one maintenance task on its own thread and connection while this node
// leads: at start, then every interval, until stopped. A failing tick is logged once per state
// change and retried on the next tick; it never stops the service. Each tick has a deadline, and
// stop() cuts a tick in flight rather than wait for it (detail/call_watch.h).
//
// Thread-safety: start()/stop()/join() from one owner thread; the task runs on the service's
// thread.
#pragma once

#include <atomic>
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

  // Runs the task for `epoch` (after joining the previous epoch's thread).
  void start(std::int64_t epoch);
  // No tick starts any more and a tick in flight is cut: returns at once. Idempotent.
  void stop();
  // Waits for the service's thread to end (after stop()).
  void join();
  // Counts the task's failures (set before start()).
  void set_error_observer(detail::ErrorObserver* observer) { errors_ = observer; }
  // Waits at least `factor` times the last run's duration between runs (0: the interval only),
  // so that an expensive task keeps its share of the database bounded (set before start()).
  void set_cost_factor(int factor) { cost_factor_ = factor; }
  // The longest a tick may take before it is cut (set before start()).
  void set_tick_deadline(Millis deadline) { tick_deadline_ = deadline; }

 private:
  // One epoch's run, with its own connection.
  struct Run {
    std::int64_t epoch = 0;
    std::atomic<bool> aborted{false};  // its calls are being cut (until join)
    std::mutex mutex;
    std::condition_variable cv;
    bool stopping = false;  // guarded by mutex
    std::unique_ptr<pqxx::connection> conn;
  };
  void loop(Run& run);

  const std::string name_;
  const detail::ConnectOptions connect_;
  const Millis interval_;
  const Task task_;
  detail::ErrorObserver* errors_ = nullptr;
  int cost_factor_ = 0;
  Millis tick_deadline_{120'000};
  std::shared_ptr<Run> run_;  // owner thread only
  std::thread thread_;
};

}  // namespace baton::worker
