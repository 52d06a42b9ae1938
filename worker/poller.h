// Poller: while this node leads at an epoch, claims due jobs (up to the batch size per statement)
// and hands them to the executor. Besides one job per free thread it keeps a short buffer of
// claimed jobs waiting for a thread, sized from the jobs' mean run time so that a buffered job
// waits about 100 ms at most: threads do not wait for a claim round trip, while slow jobs are
// not claimed long before a thread can start them. It sleeps until a NOTIFY from an enqueue, the
// buffer running low, or the poll interval. Queues with a concurrency limit never have more jobs
// claimed than their limit; paused queues are skipped by the claim itself.
//
// Thread-safety: start()/stop() from one owner thread; wake() from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/observer.h"
#include "worker/executor.h"

namespace baton::worker {

struct PollerConfig {
  detail::ConnectOptions connect;
  std::string node_id;
  detail::LockName lock;
  std::vector<std::string> queues;          // empty: all
  std::map<std::string, int> queue_limits;  // most jobs of a queue running at once
  int batch_size = 100;
  Millis poll_interval{1000};
};

class Poller {
 public:
  // `still_leading(epoch)` is the elector's lease check, asked before every claim.
  Poller(PollerConfig config, Executor& executor, detail::JobObserver* observer,
         std::function<bool(std::int64_t)> still_leading);
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  void start(std::int64_t epoch);
  // Returns once no claim is running and none will start. Idempotent.
  void stop();
  void wake();

 private:
  void loop(std::int64_t epoch);
  // One round of claims; true when a claim came back full and a slot is still free.
  bool claim_round(std::int64_t epoch);
  void wait(Millis timeout);
  // How many claimed jobs may wait for a thread, from how long jobs run.
  int buffer_size() const;

  const PollerConfig config_;
  Executor& executor_;
  detail::JobObserver* const observer_;
  const std::function<bool(std::int64_t)> still_leading_;

  std::unique_ptr<pqxx::connection> conn_;  // used by the loop thread only
  std::unique_ptr<pqxx::notification_receiver> receiver_;
  std::atomic<bool> stopping_{false};
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace baton::worker
