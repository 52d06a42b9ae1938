// Consumer: wires poller, executor and completer and follows leadership events.
#include "worker/consumer.h"

#include <spdlog/spdlog.h>

namespace baton::worker {

Consumer::Consumer(ConsumerConfig config, const detail::HandlerRegistry& handlers,
                   detail::JobObserver* observer, detail::QueueObserver* queue_observer,
                   detail::ScheduleObserver* schedule_observer,
                   std::function<bool(std::int64_t)> still_leading)
    : completer_(config.poller.connect, observer),
      executor_(config.executor, handlers, completer_, observer, [this] { poller_.wake(); }),
      poller_(config.poller, executor_, observer, std::move(still_leading)),
      rescuer_(make_rescuer(config.poller.connect, config.rescuer)),
      pruner_(make_pruner(config.poller.connect, config.pruner)),
      depth_sampler_(
          make_depth_sampler(config.poller.connect, config.depth_interval, queue_observer)),
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
  executor_.cancel(false);
  executor_.accept(epoch);
  rescuer_->start(epoch);
  poller_.start(epoch);
  pruner_->start(epoch);
  depth_sampler_->start(epoch);
  if (periodic_enqueuer_) periodic_enqueuer_->start(epoch);
  spdlog::info("consuming: epoch={}", epoch);
}

void Consumer::revoked(std::int64_t epoch) {
  std::lock_guard lock(mutex_);
  executor_.stop_accepting();
  poller_.stop();
  rescuer_->stop();
  pruner_->stop();
  depth_sampler_->stop();
  if (periodic_enqueuer_) periodic_enqueuer_->stop();
  if (queue_observer_ != nullptr) queue_observer_->queue_depths_cleared();
  executor_.cancel(true);
  spdlog::info("stopped consuming: epoch={}", epoch);
}

bool Consumer::drain(Millis grace) {
  std::lock_guard lock(mutex_);
  poller_.stop();
  // Claimed jobs that have not started go back to the queue now rather than delay the handover.
  executor_.stop_accepting();
  const bool idle = executor_.wait_idle(grace);
  if (!idle) spdlog::warn("shutdown grace ran out with handlers still running; abandoning them");
  const bool flushed = completer_.wait_flushed(grace);
  return idle && flushed;
}

void Consumer::shutdown(Millis flush_deadline) {
  std::lock_guard lock(mutex_);
  executor_.stop_accepting();
  poller_.stop();
  rescuer_->stop();
  pruner_->stop();
  depth_sampler_->stop();
  if (periodic_enqueuer_) periodic_enqueuer_->stop();
  executor_.cancel(true);
  completer_.stop(flush_deadline);
}

}  // namespace baton::worker
