// PeriodicService: a leader-only maintenance loop (see periodic.h).
#include "worker/periodic.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "baton/detail/call_watch.h"
#include "baton/detail/text.h"

namespace baton::worker {
namespace {

// A maintenance session: its statements may take a while (a depth sample of millions of rows),
// but a transaction left open is ended.
detail::ConnectOptions maintenance_session(detail::ConnectOptions connect) {
  if (connect.statement_timeout_ms == 0) connect.statement_timeout_ms = 120'000;
  if (connect.idle_in_transaction_timeout_ms == 0) connect.idle_in_transaction_timeout_ms = 10'000;
  return connect;
}

}  // namespace

PeriodicService::PeriodicService(std::string name, detail::ConnectOptions connect, Millis interval,
                                 Task task)
    : name_(std::move(name)),
      connect_(maintenance_session(std::move(connect))),
      interval_(interval),
      task_(std::move(task)) {}

PeriodicService::~PeriodicService() {
  stop();
  join();
}

void PeriodicService::start(std::int64_t epoch) {
  stop();
  join();
  run_ = std::make_shared<Run>();
  run_->epoch = epoch;
  thread_ = std::thread([this, run = run_] { loop(*run); });
}

void PeriodicService::stop() {
  if (!run_) return;
  {
    std::lock_guard lock(run_->mutex);
    run_->stopping = true;
  }
  run_->cv.notify_all();
  if (!run_->aborted.exchange(true)) {
    detail::CallWatch::instance().abort(detail::owner_of(run_.get()));
  }
}

void PeriodicService::join() {
  if (thread_.joinable()) thread_.join();
  if (run_ && run_->aborted.load()) {
    detail::CallWatch::instance().end_abort(detail::owner_of(run_.get()));
  }
  run_.reset();
}

void PeriodicService::loop(Run& run) {
  bool failing = false;
  std::unique_lock lock(run.mutex);
  while (!run.stopping) {
    lock.unlock();
    const auto began = std::chrono::steady_clock::now();
    try {
      if (!run.conn) run.conn = detail::connect(connect_, detail::owner_of(&run));
      auto armed =
          detail::CallWatch::instance().arm(*run.conn, tick_deadline_, detail::owner_of(&run));
      task_(*run.conn, run.epoch);
      if (failing) spdlog::info("{}: working again", name_);
      failing = false;
    } catch (const std::exception& e) {
      // A task that caught a connection's failure and threw its own still leaves it closed.
      if (detail::is_connection_error(e) || (run.conn && !run.conn->is_open())) run.conn.reset();
      lock.lock();
      const bool stopping = run.stopping;
      lock.unlock();
      if (!stopping) {
        if (errors_ != nullptr) errors_->database_error(name_);
        if (!failing) {
          spdlog::error("{}: {}; retrying every {}ms", name_, detail::failure_text(e),
                        interval_.count());
        }
        failing = true;
      }
    }
    const auto took = std::chrono::steady_clock::now() - began;
    const auto pause =
        std::max<std::chrono::steady_clock::duration>(interval_, took * cost_factor_);
    lock.lock();
    run.cv.wait_for(lock, pause, [&run] { return run.stopping; });
  }
  lock.unlock();
  run.conn.reset();
}

}  // namespace baton::worker
