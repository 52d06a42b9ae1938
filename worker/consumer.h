// Consumer: the worker as the Node sees it. Grant starts claiming and the leader-only services
// (rescuer, pruner, depth sampler, periodic enqueuer); revoke stops them without waiting for the
// network (calls in flight are cut) and raises cancellation for the epoch's running handlers;
// drain() lets in-flight jobs finish and their outcomes reach the database.
//
// Thread-safety: granted()/revoked() come from the elector's event thread, drain()/shutdown()
// from the node's owner thread; an internal mutex orders them.
#pragma once

#include <memory>
#include <mutex>

#include "baton/detail/lease.h"
#include "worker/completer.h"
#include "worker/depth_sampler.h"
#include "worker/executor.h"
#include "worker/periodic_enqueuer.h"
#include "worker/poller.h"
#include "worker/pruner.h"
#include "worker/rescuer.h"

namespace baton::worker {

struct ConsumerConfig {
  PollerConfig poller;  // poller.types is filled from the handlers
  ExecutorConfig executor;
  RescuerConfig rescuer;
  PrunerConfig pruner;
  Millis depth_interval{5000};
  std::vector<PeriodicJob> periodic;
};

class Consumer {
 public:
  // `lease` is this node's leadership (the elector keeps it): checked before every claim and as
  // every job starts; it must outlive the Consumer.
  Consumer(ConsumerConfig config, const detail::HandlerRegistry& handlers,
           detail::JobObserver* observer, detail::QueueObserver* queue_observer,
           detail::ScheduleObserver* schedule_observer, const detail::Lease& lease);
  ~Consumer();

  void start();  // starts the completer; claiming waits for granted()
  void granted(std::int64_t epoch);
  // Never waits for the network: claims and services in flight are cut.
  void revoked(std::int64_t epoch);
  // Stops claiming, waits up to `grace` for running handlers, then for their outcomes to be
  // written (while the lease lasts: after it, the next leader owns the jobs). True when
  // everything finished and was recorded.
  bool drain(Millis grace);
  // Stops everything; outcomes not written by `flush_deadline` are left (their jobs are rescued
  // later). False when handlers still run: the caller must then keep this object alive (their
  // threads use it), which is what abandoning them means.
  bool shutdown(Millis flush_deadline);

 private:
  // Under mutex_: no more claims, starts or services; the runs of `epoch` (0: all) are cancelled.
  void stop_leader_work(std::int64_t epoch);

  std::mutex mutex_;
  const detail::Lease& lease_;
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
