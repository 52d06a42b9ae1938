// Consumer: wires poller, executor and completer and follows leadership events.
#include "worker/consumer.h"

#include <spdlog/spdlog.h>

namespace baton::worker {
namespace {

PollerConfig with_types(PollerConfig config, const detail::HandlerRegistry& handlers) {
  config.types = handlers.types();
  return config;
}

}  // namespace

Consumer::Consumer(ConsumerConfig config, const detail::HandlerRegistry& handlers,
                   detail::JobObserver* observer, detail::QueueObserver* queue_observer,
                   detail::ScheduleObserver* schedule_observer, const detail::Lease& lease)
    : lease_(lease),
      completer_(config.poller.connect, observer),
      executor_(
          config.executor, handlers, completer_, observer, [this] { poller_.wake(); },
          [&lease](std::int64_t epoch) { return lease.valid(epoch); }),
      poller_(with_types(config.poller, handlers), executor_, observer, lease),
      rescuer_(make_rescuer(config.poller.connect, config.rescuer, config.poller.lock,
                            config.poller.node_id,
                            {[this] { return executor_.running_ids(); },
                             [this](std::int64_t id) { executor_.cancel_job(id); }})),
      pruner_(make_pruner(config.poller.connect, config.pruner)),
      depth_sampler_(make_depth_sampler(
          config.poller.connect, {config.depth_interval, config.poller.queues, handlers.types()},
          queue_observer)),
      queue_observer_(queue_observer) {
  for (auto* service : {rescuer_.get(), pruner_.get(), depth_sampler_.get()}) {
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
  // Handlers still running would wake the poller when they finish; it is destroyed first.
  executor_.detach_slot_free();
}

void Consumer::start() {
  completer_.start();
}

void Consumer::granted(std::int64_t epoch) {
  std::lock_guard lock(mutex_);
  // Runs of an earlier epoch of this node stay cancelled: the rescue leaves them alone (they
  // still run here), and their outcomes are fenced.
  executor_.accept(epoch);
  rescuer_->start(epoch);
  poller_.start(epoch);
  pruner_->start(epoch);
  depth_sampler_->start(epoch);
  if (periodic_enqueuer_) periodic_enqueuer_->start(epoch);
  spdlog::info("consuming: epoch={}", epoch);
}

void Consumer::stop_leader_work(std::int64_t epoch) {
  executor_.stop_accepting();
  executor_.end_epoch(epoch);  // running handlers see cancelled(); their database calls are cut
  poller_.stop();
  rescuer_->stop();
  pruner_->stop();
  depth_sampler_->stop();
  if (periodic_enqueuer_) periodic_enqueuer_->stop();
}

void Consumer::revoked(std::int64_t epoch) {
  std::lock_guard lock(mutex_);
  stop_leader_work(epoch);
  completer_.cut_in_flight();  // a write stuck on a dead connection is retried on a new one
  if (queue_observer_ != nullptr) queue_observer_->queue_depths_cleared();
  spdlog::info("stopped consuming: epoch={}", epoch);
}

bool Consumer::drain(Millis grace) {
  std::lock_guard lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  const auto epoch = lease_.epoch();
  poller_.stop();
  // Claimed jobs that have not started go back to the queue now rather than delay the handover.
  executor_.stop_accepting();
  const bool idle = executor_.wait_idle(grace);
  if (!idle) spdlog::warn("shutdown grace ran out with handlers still running; abandoning them");
  // The outcomes are worth waiting for while this node leads; once its lease has ended, the
  // next leader owns the jobs (and a network that stopped answering would hold us to the end).
  bool flushed = false;
  while (!(flushed = completer_.wait_flushed(Millis(20)))) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    if (epoch == 0 || !lease_.valid(epoch)) break;
  }
  return idle && flushed;
}

bool Consumer::shutdown(Millis flush_deadline) {
  std::lock_guard lock(mutex_);
  stop_leader_work(0);
  completer_.stop(flush_deadline);
  poller_.join();
  rescuer_->join();
  pruner_->join();
  depth_sampler_->join();
  if (periodic_enqueuer_) periodic_enqueuer_->join();
  return executor_.wait_idle(Millis(0));
}

}  // namespace baton::worker
