// Consumer: the worker as the Node sees it. Grant starts claiming and the leader-only maintenance
// (rescuer, pruner); revoke stops them before it returns and raises cancellation for running
// handlers; drain() lets in-flight jobs finish and
// their outcomes reach the database.
//
// Thread-safety: granted()/revoked() come from the elector's event thread, drain()/shutdown()
// from the node's owner thread; an internal mutex orders them.
#pragma once

#include <memory>
#include <mutex>

#include "worker/completer.h"
#include "worker/depth_sampler.h"
#include "worker/executor.h"
#include "worker/periodic_enqueuer.h"
#include "worker/poller.h"
#include "worker/pruner.h"
#include "worker/rescuer.h"

namespace baton::worker {

struct ConsumerConfig {
  PollerConfig poller;
  ExecutorConfig executor;
  RescuerConfig rescuer;
  PrunerConfig pruner;
  Millis depth_interval{5000};
  std::vector<PeriodicJob> periodic;
};

class Consumer {
 public:
  Consumer(ConsumerConfig config, const detail::HandlerRegistry& handlers,
           detail::JobObserver* observer, detail::QueueObserver* queue_observer,
           detail::ScheduleObserver* schedule_observer,
           std::function<bool(std::int64_t)> still_leading);
  ~Consumer();

  void start();  // starts the completer; claiming waits for granted()
  void granted(std::int64_t epoch);
  void revoked(std::int64_t epoch);
  // Stops claiming, waits up to `grace` for running handlers, then up to `grace` for their
  // outcomes to be written. True when everything finished and was recorded.
  bool drain(Millis grace);
  // Stops the completer; running handlers that did not finish are abandoned (rescued later).
  void shutdown(Millis flush_deadline);

 private:
  std::mutex mutex_;
  Completer completer_;
  Executor executor_;
  Poller poller_;
  std::unique_ptr<PeriodicService> rescuer_;
  std::unique_ptr<PeriodicService> pruner_;
  std::unique_ptr<PeriodicService> depth_sampler_;
  std::unique_ptr<PeriodicService> periodic_enqueuer_;  // null without schedules
  detail::QueueObserver* const queue_observer_;
};

}  // namespace baton::worker
