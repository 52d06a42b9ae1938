// Consumer: the worker as the Node sees it. A grant of a shard starts claiming that shard's jobs
// and its leader-only services (the rescuer; shard 0 also runs the pruner, the depth sampler and
// the periodic enqueuer); its revoke stops them without waiting for the network (calls in flight
// are cut) and raises cancellation for that epoch's running handlers. A deployment without shards
// has one, shard 0. Every shard's claims feed the node's one executor and completer.
// drain() lets in-flight jobs finish and their outcomes reach the database; drain_shard() does
// that for one shard's jobs, before a graceful hand-over of that shard.
//
// Thread-safety: granted()/revoked() come from the electors' event threads, drain()/shutdown()
// from the node's owner thread, drain_shard() from the hand-over's; an internal mutex orders the
// starts and stops, and no wait for handlers or outcomes holds it (a revoke is never held up).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

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
  PollerConfig poller;  // shard 0's; poller.types is filled from the handlers
  ExecutorConfig executor;
  RescuerConfig rescuer;
  PrunerConfig pruner;
  Millis depth_interval{5000};
  std::vector<PeriodicJob> periodic;
  // Shard k's lock row: poller.lock for shard 0, shard_lock(poller.lock, k) for the others.
  int shards = 1;
};

// The lock row of shard `shard` of the deployment whose shard 0 is `base`.
detail::LockName shard_lock(const detail::LockName& base, int shard);

class Consumer {
 public:
  // `leases[k]` is this node's leadership of shard k (its elector keeps it): checked before every
  // claim and as every job starts; they must outlive the Consumer.
  Consumer(ConsumerConfig config, const detail::HandlerRegistry& handlers,
           detail::JobObserver* observer, detail::QueueObserver* queue_observer,
           detail::ScheduleObserver* schedule_observer, std::vector<const detail::Lease*> leases);
  ~Consumer();

  void start();  // starts the completer; claiming waits for granted()
  void granted(int shard, std::int64_t epoch);
  // Never waits for the network: claims and services in flight are cut.
  void revoked(int shard, std::int64_t epoch);
  // Stops claiming, waits up to `grace` for running handlers, then for their outcomes to be
  // written (while the lease lasts: after it, the next leader owns the jobs). True when
  // everything finished and was recorded.
  bool drain(Millis grace);
  // The same for one shard, whose lease is about to be released: the others go on. False when
  // its handlers did not finish or their outcomes were not written within `grace`: the shard
  // then claims again (releasing it would let its next leader run those jobs a second time).
  bool drain_shard(int shard, Millis grace);
  // Stops everything; outcomes not written by `flush_deadline` are left (their jobs are rescued
  // later). False when handlers still run: the caller must then keep this object alive (their
  // threads use it), which is what abandoning them means.
  bool shutdown(Millis flush_deadline);

 private:
  // One shard's claiming and services.
  struct Lane {
    std::unique_ptr<Poller> poller;
    std::unique_ptr<PeriodicService> rescuer;
    std::int64_t epoch = 0;  // granted, not yet revoked
    bool drained = false;    // drain() stopped it (until its next grant)
  };
  // Under mutex_: no more claims, starts or services of `lane`; the runs of `epoch` (0: all)
  // are cancelled.
  void stop_lane(Lane& lane, std::int64_t epoch);
  bool any_lease_valid(std::int64_t epoch) const;

  std::mutex mutex_;  // guards lanes_' epochs and flags
  const std::vector<const detail::Lease*> leases_;
  Completer completer_;
  Executor executor_;
  std::vector<Lane> lanes_;
  // Shard 0's:
  std::unique_ptr<PeriodicService> pruner_;
  std::unique_ptr<PeriodicService> depth_sampler_;
  std::unique_ptr<PeriodicService> periodic_enqueuer_;  // null without schedules
  detail::QueueObserver* const queue_observer_;
};

}  // namespace baton::worker
