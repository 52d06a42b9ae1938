// Consumer: wires the pollers, executor and completer and follows leadership events.
#include "worker/consumer.h"

#include <spdlog/spdlog.h>

namespace baton::worker {
namespace {

// How long a graceful hand-over (or shutdown) lets a claim in flight come back before it cuts
// it: a claim commits on its own, so a cut one may have committed unanswered, and its jobs would
// wait for the next leader's rescue with an attempt counted. A claim takes milliseconds.
constexpr Millis kClaimGrace{1000};

PollerConfig shard_poller(PollerConfig config, const detail::HandlerRegistry& handlers, int shard,
                          int shards) {
  config.types = handlers.types();
  config.lock = shard_lock(config.lock, shard);
  config.shard = shard;
  config.cluster_limits = shards > 1;
  return config;
}

}  // namespace

detail::LockName shard_lock(const detail::LockName& base, int shard) {
  if (shard == 0) return base;
  return {base.lock_key + ":" + std::to_string(shard), base.region};
}

Consumer::Consumer(ConsumerConfig config, const detail::HandlerRegistry& handlers,
                   detail::JobObserver* observer, detail::QueueObserver* queue_observer,
                   detail::ScheduleObserver* schedule_observer,
                   std::vector<const detail::Lease*> leases)
    : leases_(std::move(leases)),
      completer_(config.poller.connect, observer),
      executor_(
          config.executor, handlers, completer_, observer,
          [this] {
            for (auto& lane : lanes_)
              lane.poller->wake();
          },
          [this](std::int64_t epoch) { return any_lease_valid(epoch); }),
      pruner_(make_pruner(config.poller.connect, config.pruner)),
      depth_sampler_(make_depth_sampler(
          config.poller.connect, {config.depth_interval, config.poller.queues, handlers.types()},
          queue_observer)),
      queue_observer_(queue_observer) {
  if (static_cast<int>(leases_.size()) != config.shards || config.shards < 1) {
    throw std::logic_error("Consumer: one lease per shard");
  }
  // A sleeping (or gathering) leader would claim an ordered partition's next job, or a job a
  // cluster-wide limit held back, only at its poll: wake it. (The completer is stopped in
  // shutdown(), before the lanes go.)
  completer_.on_claim_freed([this] {
    for (auto& lane : lanes_)
      lane.poller->claim_freed();
  });
  lanes_.resize(static_cast<std::size_t>(config.shards));
  for (int k = 0; k < config.shards; ++k) {
    auto& lane = lanes_[static_cast<std::size_t>(k)];
    lane.poller =
        std::make_unique<Poller>(shard_poller(config.poller, handlers, k, config.shards), executor_,
                                 observer, *leases_[static_cast<std::size_t>(k)]);
    auto rescue = config.rescuer;
    // Shard 0 also moves waiting jobs whose shard no longer exists.
    rescue.move_strays_shards = k == 0 ? config.shards : 0;
    rescue.node_group = config.poller.lock.group();
    lane.rescuer = make_rescuer(config.poller.connect, rescue, shard_lock(config.poller.lock, k),
                                config.poller.node_id,
                                {[this] { return executor_.running_ids(); },
                                 [this](std::int64_t id) { executor_.cancel_job(id); }});
    lane.rescuer->set_error_observer(observer);
  }
  for (auto* service : {pruner_.get(), depth_sampler_.get()}) {
    service->set_error_observer(observer);
  }
  // At most ~5 % of a database core on counting, however large the queue grows.
  depth_sampler_->set_cost_factor(20);
  if (!config.periodic.empty()) {
    periodic_enqueuer_ = make_periodic_enqueuer(config.poller.connect, std::move(config.periodic),
                                                schedule_observer);
    periodic_enqueuer_->set_error_observer(observer);
  }
}

Consumer::~Consumer() {
  shutdown(Millis(0));
  // Handlers still running would wake the pollers when they finish; they are destroyed first.
  executor_.detach_slot_free();
}

bool Consumer::any_lease_valid(std::int64_t epoch) const {
  for (const auto* lease : leases_) {
    if (lease->valid(epoch)) return true;
  }
  return false;
}

void Consumer::start() {
  completer_.start();
}

void Consumer::granted(int shard, std::int64_t epoch) {
  std::lock_guard lock(mutex_);
  auto& lane = lanes_.at(static_cast<std::size_t>(shard));
  lane.epoch = epoch;
  lane.drained = false;
  // Runs of an earlier epoch of this node stay cancelled: the rescue leaves them alone (they
  // still run here), and their outcomes are fenced.
  executor_.accept(epoch);
  lane.rescuer->start(epoch);
  lane.poller->start(epoch);
  if (shard == 0) {
    pruner_->start(epoch);
    depth_sampler_->start(epoch);
    if (periodic_enqueuer_) periodic_enqueuer_->start(epoch);
  }
  if (lanes_.size() > 1) {
    spdlog::info("consuming: shard={} epoch={}", shard, epoch);
  } else {
    spdlog::info("consuming: epoch={}", epoch);
  }
}

void Consumer::stop_lane(Lane& lane, std::int64_t epoch) {
  executor_.stop_accepting(epoch);
  // Running handlers see cancelled(); their database calls are cut.
  executor_.end_epoch(epoch);
  lane.poller->stop();
  lane.rescuer->stop();
  if (&lane == &lanes_[0]) {
    pruner_->stop();
    depth_sampler_->stop();
    if (periodic_enqueuer_) periodic_enqueuer_->stop();
  }
}

void Consumer::revoked(int shard, std::int64_t epoch) {
  std::lock_guard lock(mutex_);
  auto& lane = lanes_.at(static_cast<std::size_t>(shard));
  stop_lane(lane, epoch);
  if (lane.epoch == epoch) lane.epoch = 0;
  // A write stuck on a dead connection is retried on a new one.
  completer_.cut_in_flight();
  if (shard == 0 && queue_observer_ != nullptr) queue_observer_->queue_depths_cleared();
  if (lanes_.size() > 1) {
    spdlog::info("stopped consuming: shard={} epoch={}", shard, epoch);
  } else {
    spdlog::info("stopped consuming: epoch={}", epoch);
  }
}

bool Consumer::drain(Millis grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<std::int64_t> epochs;
  {
    // Only the stop is under the mutex: the waits below must not hold up a revoke (or a grant)
    // of a shard that this drain does not wait for.
    std::lock_guard lock(mutex_);
    // Every lane stops claiming first, and the claims in flight share one deadline: waiting for
    // one lane's claim must not leave the others claiming (with N shards, N claims' time).
    for (auto& lane : lanes_)
      lane.poller->stop_claiming();
    const auto claims_by = std::chrono::steady_clock::now() + kClaimGrace;
    for (auto& lane : lanes_) {
      // A claim that comes back is submitted, and released, before the wait.
      lane.poller->finish(claims_by);
      lane.poller->join();
      if (lane.epoch != 0) epochs.push_back(lane.epoch);
      lane.drained = true;
    }
    // Claimed jobs that have not started go back to the queue now rather than delay the
    // handover.
    executor_.stop_accepting();
  }
  const bool idle = executor_.wait_idle(grace);
  if (!idle) spdlog::warn("shutdown grace ran out with handlers still running; abandoning them");
  // The outcomes are worth waiting for while this node leads; once its leases have ended, the
  // next leaders own the jobs (and a network that stopped answering would hold us to the end).
  bool flushed = false;
  while (!(flushed = completer_.wait_flushed(Millis(20)))) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    bool leading = false;
    for (const auto e : epochs)
      leading = leading || any_lease_valid(e);
    if (!leading) break;
  }
  return idle && flushed;
}

bool Consumer::drain_shard(int shard, Millis grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  auto& lane = lanes_.at(static_cast<std::size_t>(shard));
  std::int64_t epoch = 0;
  {
    std::lock_guard lock(mutex_);
    epoch = lane.epoch;
    if (epoch == 0) return true;
    lane.poller->finish(kClaimGrace);
    lane.poller->join();
    executor_.stop_accepting(epoch);
  }
  const bool idle = executor_.wait_epoch_idle(epoch, grace);
  bool settled = false;
  if (idle) {
    // Every outcome of the shard's runs (and releases of its claimed jobs) is added by now.
    const auto mark = completer_.added();
    while (!(settled = completer_.wait_settled(mark, Millis(20)))) {
      if (std::chrono::steady_clock::now() >= deadline || !any_lease_valid(epoch)) break;
    }
  }
  if (idle && settled) return true;
  // Releasing the shard now would let its next leader run again what still runs here (or what
  // finished and is not recorded yet): keep it, and claim again, while the lease lasts.
  std::lock_guard lock(mutex_);
  if (!lane.drained && lane.epoch == epoch &&
      leases_.at(static_cast<std::size_t>(shard))->valid(epoch)) {
    executor_.accept(epoch);
    lane.poller->start(epoch);
  }
  spdlog::warn("shard {}: not handed over: {} within the grace ({}ms); it stays here for now",
               shard,
               idle ? "the outcomes of its jobs were not recorded" : "its handlers did not finish",
               grace.count());
  return false;
}

bool Consumer::shutdown(Millis flush_deadline) {
  std::lock_guard lock(mutex_);
  for (auto& lane : lanes_)
    stop_lane(lane, 0);
  completer_.stop(flush_deadline);
  for (auto& lane : lanes_) {
    lane.poller->join();
    lane.rescuer->join();
  }
  pruner_->join();
  depth_sampler_->join();
  if (periodic_enqueuer_) periodic_enqueuer_->join();
  return executor_.wait_idle(Millis(0));
}

}  // namespace baton::worker
