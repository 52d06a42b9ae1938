// Executor: handler runs on the asio pool, with outcome classification (see executor.h).
#include "worker/executor.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

namespace baton::worker {
namespace {

using Clock = std::chrono::steady_clock;

// Each pool thread's own generator for retry jitter.
std::mt19937_64& thread_rng() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng;
}
// Each pool thread keeps its own connection for transactional handlers (a pool thread belongs to
// one executor for its whole life, so the options never change under it).
thread_local std::unique_ptr<pqxx::connection> tl_conn;

}  // namespace

Executor::Executor(ExecutorConfig config, const detail::HandlerRegistry& handlers,
                   Completer& completer, detail::JobObserver* observer,
                   std::function<void()> on_slot_free)
    : config_(std::move(config)),
      handlers_(handlers),
      completer_(completer),
      observer_(observer),
      on_slot_free_(std::move(on_slot_free)),
      pool_(std::make_unique<boost::asio::thread_pool>(config_.threads)) {}

Executor::~Executor() {
  if (pool_) pool_->join();
}

int Executor::busy_in(const std::string& queue) const {
  std::lock_guard lock(queue_mutex_);
  auto it = queue_busy_.find(queue);
  return it == queue_busy_.end() ? 0 : it->second;
}

void Executor::submit(detail::ClaimedJob job) {
  const int busy = busy_.fetch_add(1) + 1;
  const int waiting = waiting_.fetch_add(1) + 1;
  if (observer_ != nullptr) observer_->claimed_waiting(waiting);
  {
    std::lock_guard lock(queue_mutex_);
    ++queue_busy_[job.job.queue];
  }
  if (observer_ != nullptr) observer_->pool_busy(busy, config_.threads);
  boost::asio::post(*pool_, [this, job = std::move(job)] {
    const int still_waiting = waiting_.fetch_sub(1) - 1;
    if (observer_ != nullptr) observer_->claimed_waiting(still_waiting);
    if (job.job.epoch == accepting_.load()) {
      if (observer_ != nullptr) {
        const double held = std::chrono::duration<double>(Clock::now() - job.claimed).count();
        observer_->job_started(job.job.queue, job.job.type, job.wait_seconds + held);
      }
      const auto started = Clock::now();
      run(job);
      const double took = std::chrono::duration<double>(Clock::now() - started).count();
      const double mean = mean_run_seconds_.load(std::memory_order_relaxed);
      mean_run_seconds_.store(mean == 0 ? took : mean + (took - mean) / 16,
                              std::memory_order_relaxed);
    } else {
      completer_.add(detail::Release{job.job.id, job.job.epoch, job.job.attempt});
    }
    {
      std::lock_guard lock(queue_mutex_);
      if (--queue_busy_[job.job.queue] == 0) queue_busy_.erase(job.job.queue);
    }
    const int now_busy = busy_.fetch_sub(1) - 1;
    if (observer_ != nullptr) observer_->pool_busy(now_busy, config_.threads);
    if (now_busy == 0) {
      std::lock_guard lock(idle_mutex_);
      idle_cv_.notify_all();
    }
    if (waiting_.load() > refill_mark_.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(slot_free_mutex_);
    if (on_slot_free_) on_slot_free_();
  });
}

bool Executor::wait_idle(Millis timeout) {
  std::unique_lock lock(idle_mutex_);
  return idle_cv_.wait_for(lock, timeout, [this] { return busy_.load() == 0; });
}

void Executor::detach_slot_free() {
  std::lock_guard lock(slot_free_mutex_);
  on_slot_free_ = nullptr;
}

bool Executor::run_transactional(const detail::HandlerEntry& entry, JobContext& ctx,
                                 const std::string& row_at, double& run_seconds) {
  const auto started = Clock::now();
  try {
    if (!tl_conn) tl_conn = detail::connect(config_.connect);
    pqxx::work tx(*tl_conn);
    entry.transactional(ctx, tx);
    if (Clock::now() > ctx.deadline()) throw std::runtime_error("timeout: ran past its limit");
    run_seconds = std::chrono::duration<double>(Clock::now() - started).count();
    const Job& job = ctx.job();
    if (!detail::complete_in(
            tx, {job.id, job.epoch, run_seconds, job.attempt, job.queue, job.type, row_at})) {
      tx.abort();
      spdlog::warn(
          "job FENCED: job={} queue={} type={} epoch={}: a newer epoch owns it; the "
          "handler's writes were rolled back",
          job.id, job.queue, job.type, job.epoch);
      if (observer_ != nullptr) observer_->jobs_fenced(job.queue, job.type, 1);
      return false;
    }
    tx.commit();
    return true;
  } catch (const std::exception& e) {
    if (detail::is_connection_error(e)) tl_conn.reset();
    throw;
  }
}

void Executor::run(const detail::ClaimedJob& claimed) {
  const Job& job = claimed.job;
  const auto started = Clock::now();
  const auto deadline = claimed.timeout_ms > 0
                            ? started + std::chrono::milliseconds(claimed.timeout_ms)
                            : Clock::time_point::max();
  std::string error;
  std::string dead_reason;  // non-empty: never retry
  bool recorded = false;    // a transactional handler completed (or was fenced) by itself
  std::optional<std::chrono::milliseconds> retry_in;  // the handler chose the delay
  const detail::HandlerEntry* entry = handlers_.find(job.type);
  double run_seconds = 0;
  if (entry != nullptr) {
    try {
      JobContext ctx(job, deadline, cancelled_);
      if (entry->transactional) {
        const bool committed = run_transactional(*entry, ctx, claimed.row_at, run_seconds);
        recorded = true;
        if (committed && observer_ != nullptr) {
          observer_->job_finished(job.queue, job.type, detail::Outcome::completed, run_seconds,
                                  claimed.since_enqueue_seconds + run_seconds);
        }
      } else {
        entry->plain(ctx);
        if (Clock::now() > deadline) {
          error = "timeout: ran past its " + std::to_string(claimed.timeout_ms) + "ms limit";
        }
      }
    } catch (const PayloadError& e) {
      error = e.what();
      dead_reason = "bad_payload";
    } catch (const Discard& e) {
      error = e.what();
      dead_reason = "discarded";
    } catch (const RetryIn& e) {
      error = e.what();
      if (error.empty()) error = "asked to retry";
      retry_in = e.delay();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "handler threw an exception with an empty message";
    } catch (...) {
      error = "handler threw something that is not a std::exception";
    }
  } else {
    error = "no handler is registered for job type '" + job.type + "' on node " + config_.node_id +
            "; register one with node.handle(\"" + job.type + "\", ...) or enqueue a known type";
    dead_reason = "unknown_type";
  }
  if (recorded && error.empty()) return;
  run_seconds = std::chrono::duration<double>(Clock::now() - started).count();

  if (error.empty()) {
    completer_.add(detail::Completion{job.id, job.epoch, run_seconds, job.attempt, job.queue,
                                      job.type, claimed.row_at});
    if (observer_ != nullptr) {
      observer_->job_finished(job.queue, job.type, detail::Outcome::completed, run_seconds,
                              claimed.since_enqueue_seconds + run_seconds);
    }
    return;
  }
  const bool exhausted = job.attempt >= job.max_attempts;
  if (dead_reason.empty() && exhausted) dead_reason = "exhausted";
  detail::Failure f{job.id,      job.epoch, job.attempt, error,   !dead_reason.empty(),
                    dead_reason, 0,         job.queue,   job.type};
  if (!f.dead) {
    const auto& policy = entry != nullptr && entry->retry ? *entry->retry : config_.retry;
    f.retry_delay_ms = retry_in ? std::max<std::int64_t>(0, retry_in->count())
                                : policy.delay(job.attempt, thread_rng()).count();
  }
  spdlog::warn(
      "job failed: job={} queue={} type={} epoch={} attempt={}/{} {}: {}", job.id, job.queue,
      job.type, job.epoch, job.attempt, job.max_attempts,
      f.dead ? "dead (" + dead_reason + ")" : "retry in " + std::to_string(f.retry_delay_ms) + "ms",
      error);
  completer_.add(std::move(f));
  if (observer_ != nullptr) {
    observer_->job_finished(job.queue, job.type,
                            dead_reason.empty() ? detail::Outcome::retried : detail::Outcome::dead,
                            run_seconds, claimed.since_enqueue_seconds + run_seconds);
  }
}

}  // namespace baton::worker
