// PeriodicService: a leader-only maintenance loop (see periodic.h).
#include "worker/periodic.h"

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
    try {
      if (!conn_) conn_ = detail::connect(connect_);
      task_(*conn_, epoch);
      if (failing) spdlog::info("{}: working again", name_);
      failing = false;
    } catch (const std::exception& e) {
      if (detail::is_connection_error(e)) conn_.reset();
      if (errors_ != nullptr) errors_->database_error(name_);
      if (!failing)
        spdlog::error("{}: {}; retrying every {}ms", name_, e.what(), interval_.count());
      failing = true;
    }
    lock.lock();
    cv_.wait_for(lock, interval_, [this] { return stopping_; });
  }
}

}  // namespace baton::worker
