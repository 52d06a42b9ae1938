// Completer: batched, fenced outcome writes (see completer.h).
#include "worker/completer.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "baton/detail/backoff.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/text.h"

namespace baton::worker {

detail::ConnectOptions completion_session(detail::ConnectOptions connect) {
  if (connect.statement_timeout_ms == 0) connect.statement_timeout_ms = 60'000;
  if (connect.idle_in_transaction_timeout_ms == 0) connect.idle_in_transaction_timeout_ms = 10'000;
  connect.synchronous_commit_off = false;
  // The completion's plan (primary-key lookups of the given ids) never depends on the values:
  // plan it once per connection rather than once per batch.
  connect.generic_plans = true;
  return connect;
}

namespace {

// A batch that has not been written this long is cut and written again on a new connection.
constexpr auto kWriteDeadline = std::chrono::seconds(30);
// How long the outcomes of a write whose COMMIT lost its answer wait for the server to end that
// transaction before they are sent again.
constexpr auto kWriteDoubtWait = std::chrono::seconds(60);

}  // namespace

Completer::Completer(detail::ConnectOptions connect, detail::JobObserver* observer)
    : connect_(completion_session(std::move(connect))), observer_(observer) {}

Completer::~Completer() {
  stop(Millis(0));
}

void Completer::start() {
  thread_ = std::thread([this] { loop(); });
}

void Completer::stop(Millis deadline) {
  {
    std::unique_lock lock(mutex_);
    if (!thread_.joinable()) return;
    stopping_ = true;
    stop_deadline_ = std::chrono::steady_clock::now() + deadline;
    cv_.notify_all();
    // Until the deadline the pending outcomes may still be written; then a write in flight is
    // cut (the network may have stopped answering), and the thread gives up.
    flushed_cv_.wait_until(lock, stop_deadline_, [this] { return exited_; });
  }
  detail::CallWatch::instance().abort(detail::owner_of(this));
  thread_.join();
  detail::CallWatch::instance().end_abort(detail::owner_of(this));
}

void Completer::cut_in_flight() {
  detail::CallWatch::instance().abort(detail::owner_of(this));
  detail::CallWatch::instance().end_abort(detail::owner_of(this));
}

void Completer::add(detail::Completion done) {
  {
    std::lock_guard lock(mutex_);
    done_.push_back(std::move(done));
    order_.push_back(Kind::done);
    ++added_;
    if (observer_ != nullptr) observer_->completer_pending(queued() + in_flight_);
  }
  cv_.notify_one();
}

void Completer::add(detail::Failure failed) {
  {
    std::lock_guard lock(mutex_);
    failed_.push_back(std::move(failed));
    order_.push_back(Kind::failed);
    ++added_;
    if (observer_ != nullptr) observer_->completer_pending(queued() + in_flight_);
  }
  cv_.notify_one();
}

void Completer::add(detail::Release released) {
  {
    std::lock_guard lock(mutex_);
    released_.push_back(std::move(released));
    order_.push_back(Kind::released);
    ++added_;
    if (observer_ != nullptr) observer_->completer_pending(queued() + in_flight_);
  }
  cv_.notify_one();
}

std::size_t Completer::pending() const {
  std::lock_guard lock(mutex_);
  return queued() + in_flight_;
}

std::uint64_t Completer::added() const {
  std::lock_guard lock(mutex_);
  return added_;
}

bool Completer::wait_settled(std::uint64_t mark, Millis timeout) {
  std::unique_lock lock(mutex_);
  return flushed_cv_.wait_for(lock, timeout, [&] { return settled_ >= mark; });
}

bool Completer::wait_flushed(Millis timeout) {
  std::unique_lock lock(mutex_);
  return flushed_cv_.wait_for(lock, timeout, [this] { return queued() == 0 && in_flight_ == 0; });
}

void Completer::loop() {
  std::vector<detail::Completion> done;
  std::vector<detail::Failure> failed;
  std::vector<detail::Release> released;
  detail::Backoff backoff(Millis(50), Millis(2000));
  bool reported = false;
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] {
      return stopping_ || queued() > 0 || !done.empty() || !failed.empty() || !released.empty();
    });
    // What failed to write last time is still in done/failed/released; the oldest queued
    // outcomes join it, up to a write's size.
    const std::size_t carried = done.size() + failed.size() + released.size();
    take(carried < kMaxWrite ? kMaxWrite - carried : 0, done, failed, released);
    in_flight_ = done.size() + failed.size() + released.size();
    if (in_flight_ == 0) {
      settled_ = taken_;
      flushed_cv_.notify_all();
      if (stopping_) {
        exited_ = true;
        flushed_cv_.notify_all();
        return;
      }
      continue;
    }
    lock.unlock();
    bool ok = true;
    const auto began = std::chrono::steady_clock::now();
    // An outcome of a job of an ordered partition, or of a queue limited across the cluster: once
    // written, another job may be claimed (a spare wake costs one claim). For the limit, on
    // another node too, whose leaders of the queue's other shards may sleep until their poll:
    // the queues to wake them for.
    bool frees_claim = false;
    std::vector<std::string> limited;
    const auto note = [&](const auto& outcomes) {
      for (const auto& o : outcomes) {
        frees_claim = frees_claim || o.partitioned || o.cluster_limited;
        if (o.cluster_limited &&
            std::find(limited.begin(), limited.end(), o.queue) == limited.end())
          limited.push_back(o.queue);
      }
    };
    note(done);
    note(failed);
    note(released);
    try {
      write(done, failed, released);
      if (reported) spdlog::info("completer: database reachable again");
      reported = false;
      backoff.reset();
    } catch (const std::exception& e) {
      ok = false;
      conn_.reset();
      if (observer_ != nullptr) observer_->database_error("completer");
      if (!reported) {
        // A write the call watch cut fails as a lost connection: say what happened instead.
        if (std::chrono::steady_clock::now() - began >= kWriteDeadline) {
          spdlog::error(
              "completer: a write of {} outcomes was still running after {}s and was cut (the "
              "server is stalled or too busy to keep up); retrying",
              in_flight_, kWriteDeadline.count());
        } else {
          spdlog::error("completer: could not record {} outcomes ({}); retrying", in_flight_,
                        detail::failure_text(e));
        }
        reported = true;
      }
    }
    if (ok && frees_claim && claim_freed_) claim_freed_();
    if (ok && !limited.empty()) wake_other_nodes(limited);
    lock.lock();
    if (ok) {
      in_flight_ = 0;
      settled_ = taken_;
      if (observer_ != nullptr) observer_->completer_pending(queued());
      flushed_cv_.notify_all();
      continue;
    }
    if (stopping_ && std::chrono::steady_clock::now() >= stop_deadline_) {
      spdlog::error(
          "completer: gave up on {} outcomes at shutdown; their jobs stay running "
          "until the next leader rescues them",
          in_flight_ + queued());
      taken_ += queued();
      done_.clear();
      failed_.clear();
      released_.clear();
      order_.clear();
      in_flight_ = 0;
      settled_ = taken_;
      exited_ = true;
      flushed_cv_.notify_all();
      return;
    }
    cv_.wait_for(lock, backoff.next());
  }
}

void Completer::take(std::size_t n, std::vector<detail::Completion>& done,
                     std::vector<detail::Failure>& failed, std::vector<detail::Release>& released) {
  n = std::min(n, queued());
  if (n == 0) return;
  taken_ += n;
  // The first n added are the first of each kind, as many of each as the first n hold.
  std::size_t of[3] = {0, 0, 0};
  if (n == queued()) {
    of[static_cast<std::size_t>(Kind::done)] = done_.size();
    of[static_cast<std::size_t>(Kind::failed)] = failed_.size();
    of[static_cast<std::size_t>(Kind::released)] = released_.size();
  } else {
    for (std::size_t i = 0; i < n; ++i)
      ++of[static_cast<std::size_t>(order_[i])];
  }
  order_.erase(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n));
  auto move_front = [](auto& from, auto& to, std::size_t count) {
    const auto end = from.begin() + static_cast<std::ptrdiff_t>(count);
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(end));
    from.erase(from.begin(), end);
  };
  move_front(done_, done, of[static_cast<std::size_t>(Kind::done)]);
  move_front(failed_, failed, of[static_cast<std::size_t>(Kind::failed)]);
  move_front(released_, released, of[static_cast<std::size_t>(Kind::released)]);
}

void Completer::wake_other_nodes(const std::vector<std::string>& queues) {
  // After the write's commit, so a woken claim sees the place free; only where a leader may be
  // asleep. Best effort: a node that misses it claims at its next poll, as before this wake
  // existed.
  try {
    if (!conn_) conn_ = detail::connect(connect_, detail::owner_of(this));
    auto armed = detail::CallWatch::instance().arm(*conn_, kWriteDeadline, detail::owner_of(this));
    pqxx::nontransaction tx(*conn_);
    detail::wake_limited_queues(tx, connect_.schema, queues);
    wake_reported_ = false;
  } catch (const std::exception& e) {
    conn_.reset();
    if (observer_ != nullptr) observer_->database_error("completer");
    if (!wake_reported_) {  // once until a wake goes through again
      spdlog::warn(
          "completer: could not wake the other nodes for queue(s) limited across the cluster "
          "({}); they claim the freed places at their next poll",
          detail::failure_text(e));
      wake_reported_ = true;
    }
  }
}

void Completer::write(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
                      std::vector<detail::Release>& released) {
  if (!conn_) {
    conn_ = detail::connect(connect_, detail::owner_of(this));
  }
  auto armed = detail::CallWatch::instance().arm(*conn_, kWriteDeadline, detail::owner_of(this));
  if (doubt_) {
    resolve_doubt(done, failed, released);
    if (done.empty() && failed.empty() && released.empty()) return;
  }
  try {
    apply(done, failed, released);
  } catch (const std::exception& e) {
    if (detail::is_connection_error(e) || !conn_->is_open()) throw;
    // A data error (a value PostgreSQL refuses): one bad outcome must not hold up the others, on
    // this leader or the next. Write each on its own; a bad one is written again as a failure
    // with a message that cannot be refused.
    spdlog::error("completer: a batch of {} outcomes was refused ({}); writing them one by one",
                  done.size() + failed.size() + released.size(), detail::one_line(e.what()));
    isolate(done, failed, released);
  }
}

void Completer::apply(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
                      std::vector<detail::Release>& released) {
  const std::size_t sent = done.size() + failed.size();
  std::vector<std::int64_t> fenced;
  std::size_t put_back = 0;
  std::string in_doubt;
  std::size_t applied = 0;
  try {
    applied = detail::apply_outcomes(*conn_, done, failed, &fenced, released, &put_back, &in_doubt);
  } catch (const std::exception&) {
    if (!in_doubt.empty()) {
      Doubt d{in_doubt, {}, std::chrono::steady_clock::now()};
      for (const auto& o : done)
        d.claims.emplace_back(o.id, o.token);
      for (const auto& o : failed)
        d.claims.emplace_back(o.id, o.token);
      for (const auto& o : released)
        d.claims.emplace_back(o.id, o.token);
      doubt_ = std::move(d);
    }
    throw;
  }
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
      // (A job may be fenced twice: two outcomes of two claims in one write.)
      std::map<std::pair<std::string, std::string>, std::size_t> by_kind;
      std::unordered_map<std::int64_t, std::size_t> times;
      for (const auto id : fenced)
        ++times[id];
      auto count = [&](std::int64_t id, const std::string& queue, const std::string& type) {
        const auto it = times.find(id);
        if (it == times.end() || it->second == 0) return;
        --it->second;
        ++by_kind[{queue, type}];
      };
      for (const auto& d : done)
        count(d.id, d.queue, d.type);
      for (const auto& f : failed)
        count(f.id, f.queue, f.type);
      for (const auto& [kind, n] : by_kind)
        observer_->jobs_fenced(kind.first, kind.second, n);
    }
  }
  done.clear();
  failed.clear();
  released.clear();
}

void Completer::resolve_doubt(std::vector<detail::Completion>& done,
                              std::vector<detail::Failure>& failed,
                              std::vector<detail::Release>& released) {
  std::string status = detail::transaction_status(*conn_, doubt_->xid);
  if (status == "in progress") {
    // Its session has not ended it yet (the server has not seen the client go): it may still
    // commit. A COMMIT that never reached the server ends by the session's idle-in-transaction
    // timeout; one held by a synchronous standby may not end soon, and the other outcomes wait
    // behind it: after kWriteDoubtWait the batch is sent again (its outcomes then wait for that
    // transaction's row locks, and are fenced if it commits: nothing is written twice).
    if (std::chrono::steady_clock::now() - doubt_->since < kWriteDoubtWait) {
      throw std::runtime_error(
          "a write whose COMMIT lost its answer is still in progress on the server; its "
          "outcomes are written again once it has ended");
    }
    status = "still in progress after " + std::to_string(kWriteDoubtWait.count()) + "s";
  }
  const std::size_t carried = doubt_->claims.size();
  if (status == "committed") {
    std::sort(doubt_->claims.begin(), doubt_->claims.end());
    auto written = [&](const auto& o) {
      return std::binary_search(doubt_->claims.begin(), doubt_->claims.end(),
                                std::make_pair(o.id, o.token));
    };
    std::erase_if(done, written);
    std::erase_if(failed, written);
    std::erase_if(released, written);
  }
  spdlog::info("completer: a write of {} outcomes lost the answer to its COMMIT; {}", carried,
               status == "committed"
                   ? std::string("the server says it committed: not written again")
               : status == "aborted"
                   ? std::string("the server says it did not commit: writing them again")
                   : "the server cannot tell (" + status +
                         "): writing them again (any it wrote are then counted as fenced)");
  doubt_.reset();
}

namespace {

// A failure that PostgreSQL cannot refuse: ASCII text, a delay in range.
detail::Failure safe_failure(detail::Failure f, const std::string& why) {
  std::string ascii;
  for (char c : f.error.substr(0, 200)) {
    ascii += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  f.error = "the outcome could not be recorded as it was (" + why + "); the handler said: " + ascii;
  f.retry_delay_ms = std::clamp<std::int64_t>(f.retry_delay_ms, 0, 3'600'000);
  return f;
}

}  // namespace

void Completer::isolate(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
                        std::vector<detail::Release>& released) {
  // Runs one outcome; true when written (or fenced), false on a data error. A lost connection
  // propagates, leaving in the vectors only what was not written yet.
  auto attempt = [&](auto&& write_one) -> std::string {
    try {
      write_one();
      return "";
    } catch (const std::exception& e) {
      if (detail::is_connection_error(e) || !conn_->is_open()) throw;
      const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e);
      return sql != nullptr && !sql->sqlstate().empty() ? "SQLSTATE " + sql->sqlstate()
                                                        : detail::one_line(e.what());
    }
  };
  auto give_up = [](std::int64_t id, const std::string& why) {
    spdlog::error(
        "completer: the outcome of job={} cannot be recorded ({}); it stays running until a "
        "newer epoch rescues it",
        id, why);
  };
  while (!done.empty()) {
    const auto d = done.back();
    std::vector<detail::Completion> one{d};
    std::vector<detail::Failure> none;
    std::vector<detail::Release> no_release;
    const auto why = attempt([&] { apply(one, none, no_release); });
    done.pop_back();
    // A completion carries no text of the handler's: a refusal here is not the data's fault.
    if (!why.empty()) give_up(d.id, why);
  }
  while (!failed.empty()) {
    const auto f = failed.back();
    std::vector<detail::Completion> none;
    std::vector<detail::Failure> one{f};
    std::vector<detail::Release> no_release;
    const auto why = attempt([&] { apply(none, one, no_release); });
    if (why.empty()) {
      failed.pop_back();
      continue;
    }
    // It stays in the vector, in its safe form, until that is written: a connection lost now
    // leaves it there for the next connection.
    failed.back() = safe_failure(f, why);
    std::vector<detail::Failure> safe{failed.back()};
    const auto again = attempt([&] { apply(none, safe, no_release); });
    failed.pop_back();
    if (!again.empty()) give_up(f.id, again);
  }
  while (!released.empty()) {
    std::vector<detail::Completion> none;
    std::vector<detail::Failure> no_failure;
    std::vector<detail::Release> one{released.back()};
    const auto why = attempt([&] { apply(none, no_failure, one); });
    if (!why.empty()) give_up(released.back().id, why);
    released.pop_back();
  }
}

}  // namespace baton::worker
