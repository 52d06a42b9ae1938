// PeriodicService: a leader-only maintenance loop (see periodic.h).
#include "worker/periodic.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace baton::worker {

PeriodicService::PeriodicService(std::string name, detail::ConnectOptions connect, Millis interval,
                                 Task task)
    : name_(std::move(name)),
      connect_(std::move(connect)),
      interval_(interval),
      task_(std::move(task)) {}

PeriodicService::~PeriodicService() {
  stop();
}

void PeriodicService::start(std::int64_t epoch) {
  stop();
  {
    std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this, epoch] { loop(epoch); });
}

void PeriodicService::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeriodicService::loop(std::int64_t epoch) {
  bool failing = false;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    const auto began = std::chrono::steady_clock::now();
    try {
      if (!conn_) conn_ = detail::connect(connect_);
      task_(*conn_, epoch);
      if (failing) spdlog::info("{}: working again", name_);
      failing = false;
    } catch (const std::exception& e) {
      if (detail::is_connection_error(e)) conn_.reset();
      if (errors_ != nullptr) errors_->database_error(name_);
      if (!failing)
        spdlog::error("{}: {}; retrying every {}ms", name_, detail::scrub(e.what()),
                      interval_.count());
      failing = true;
    }
    const auto took = std::chrono::steady_clock::now() - began;
    const auto pause =
        std::max<std::chrono::steady_clock::duration>(interval_, took * cost_factor_);
    lock.lock();
    cv_.wait_for(lock, pause, [this] { return stopping_; });
  }
}

}  // namespace baton::worker
