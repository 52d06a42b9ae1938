// Completer: batched, fenced outcome writes (see completer.h).
#include "worker/completer.h"

#include <map>
#include <unordered_set>

#include <spdlog/spdlog.h>

namespace baton::worker {

Completer::Completer(detail::ConnectOptions connect, detail::JobObserver* observer)
    : connect_(std::move(connect)), observer_(observer) {}

Completer::~Completer() {
  stop(Millis(0));
}

void Completer::start() {
  thread_ = std::thread([this] { loop(); });
}

void Completer::stop(Millis deadline) {
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable()) return;
    stopping_ = true;
    stop_deadline_ = std::chrono::steady_clock::now() + deadline;
  }
  cv_.notify_all();
  thread_.join();
}

void Completer::add(detail::Completion done) {
  {
    std::lock_guard lock(mutex_);
    done_.push_back(std::move(done));
    if (observer_ != nullptr) observer_->completer_pending(queued() + in_flight_);
  }
  cv_.notify_one();
}

void Completer::add(detail::Failure failed) {
  {
    std::lock_guard lock(mutex_);
    failed_.push_back(std::move(failed));
    if (observer_ != nullptr) observer_->completer_pending(queued() + in_flight_);
  }
  cv_.notify_one();
}

void Completer::add(detail::Release released) {
  {
    std::lock_guard lock(mutex_);
    released_.push_back(released);
    if (observer_ != nullptr) observer_->completer_pending(queued() + in_flight_);
  }
  cv_.notify_one();
}

std::size_t Completer::pending() const {
  std::lock_guard lock(mutex_);
  return queued() + in_flight_;
}

bool Completer::wait_flushed(Millis timeout) {
  std::unique_lock lock(mutex_);
  return flushed_cv_.wait_for(lock, timeout, [this] { return queued() == 0 && in_flight_ == 0; });
}

void Completer::loop() {
  std::vector<detail::Completion> done;
  std::vector<detail::Failure> failed;
  std::vector<detail::Release> released;
  Millis backoff{50};
  bool reported = false;
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] {
      return stopping_ || queued() > 0 || !done.empty() || !failed.empty() || !released.empty();
    });
    // Take everything queued; what failed to write last time is still in done/failed/released.
    if (done.empty()) {
      done.swap(done_);
    } else {
      for (auto& d : done_)
        done.push_back(std::move(d));
      done_.clear();
    }
    for (auto& f : failed_)
      failed.push_back(std::move(f));
    failed_.clear();
    released.insert(released.end(), released_.begin(), released_.end());
    released_.clear();
    in_flight_ = done.size() + failed.size() + released.size();
    if (in_flight_ == 0) {
      flushed_cv_.notify_all();
      if (stopping_) return;
      continue;
    }
    lock.unlock();
    bool ok = true;
    try {
      write(done, failed, released);
      if (reported) spdlog::info("completer: database reachable again");
      reported = false;
      backoff = Millis(50);
    } catch (const std::exception& e) {
      ok = false;
      conn_.reset();
      if (observer_ != nullptr) observer_->database_error("completer");
      if (!reported) {
        spdlog::error("completer: could not record {} outcomes ({}); retrying", in_flight_,
                      detail::scrub(e.what()));
        reported = true;
      }
    }
    lock.lock();
    if (ok) {
      in_flight_ = 0;
      if (observer_ != nullptr) observer_->completer_pending(queued());
      flushed_cv_.notify_all();
      continue;
    }
    if (stopping_ && std::chrono::steady_clock::now() >= stop_deadline_) {
      spdlog::error(
          "completer: gave up on {} outcomes at shutdown; their jobs stay running "
          "until the next leader rescues them",
          in_flight_);
      in_flight_ = 0;
      flushed_cv_.notify_all();
      return;
    }
    cv_.wait_for(lock, backoff);
    backoff = std::min(backoff * 2, Millis(2000));
  }
}

void Completer::write(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
                      std::vector<detail::Release>& released) {
  if (!conn_) {
    conn_ = detail::connect(connect_);
    // The completion's plan (primary-key lookups of the given ids) never depends on the values:
    // plan it once per connection rather than once per batch.
    pqxx::nontransaction(*conn_).exec("SET plan_cache_mode = force_generic_plan");
  }
  const std::size_t sent = done.size() + failed.size();
  std::vector<std::int64_t> fenced;
  std::size_t put_back = 0;
  const std::size_t applied =
      detail::apply_outcomes(*conn_, done, failed, &fenced, released, &put_back);
  if (put_back > 0) {
    spdlog::info("completer: put {} claimed job(s) that had not started back in the queue",
                 put_back);
    if (observer_ != nullptr) observer_->jobs_released(put_back);
  }
  if (applied < sent) {
    spdlog::warn("completer: {} of {} outcomes were FENCED (their jobs belong to a newer epoch)",
                 sent - applied, sent);
    if (observer_ != nullptr) {
      // Count them by queue and type.
      std::map<std::pair<std::string, std::string>, std::size_t> by_kind;
      const std::unordered_set<std::int64_t> ids(fenced.begin(), fenced.end());
      for (const auto& d : done) {
        if (ids.count(d.id) != 0) ++by_kind[{d.queue, d.type}];
      }
      for (const auto& f : failed) {
        if (ids.count(f.id) != 0) ++by_kind[{f.queue, f.type}];
      }
      for (const auto& [kind, n] : by_kind)
        observer_->jobs_fenced(kind.first, kind.second, n);
    }
  }
  done.clear();
  failed.clear();
  released.clear();
}

}  // namespace baton::worker
