// Deadlines and aborts for blocking database calls (see call_watch.h).
#include "baton/detail/call_watch.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "baton/detail/db.h"
#include "baton/detail/text.h"

namespace baton::detail {

namespace {
// This thread's last watched call, and how it ended once disarmed.
thread_local std::uint64_t last_call_id = 0;
thread_local CallWatch::Ending last_ending = CallWatch::Ending::none;
}  // namespace

struct CallWatch::State {
  struct Call {
    std::uint64_t id;
    int fd;
    Clock::time_point deadline;
    Owner owner;
    std::function<Clock::time_point()> later;  // may move the deadline (empty: fixed)
    bool cut = false;
    bool aborted = false;  // cut by abort(), not at its deadline
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Call> calls;
  std::multiset<Owner> aborting;
  std::uint64_t next_id = 1;
  // When the watchdog wakes next on its own (under mutex). A call armed with a later deadline
  // needs no wake-up: waking the watchdog on every call cost a context switch per claim.
  Clock::time_point wakes_at = Clock::time_point::min();
  std::atomic<std::uint64_t> cut_count{0};
  bool stopping = false;
  std::thread thread;

  // Under mutex.
  void cut_call(Call& c) {
    if (c.cut) return;
    c.cut = true;
    ::shutdown(c.fd, SHUT_RDWR);  // libpq sees the connection end; the fd stays open
    cut_count.fetch_add(1, std::memory_order_relaxed);
  }
};

CallWatch& CallWatch::instance() {
  // Never destroyed: a thread abandoned at shutdown (stuck on the network) may still disarm its
  // call while the process exits.
  static CallWatch* const watch = new CallWatch();  // NOLINT(cppcoreguidelines-owning-memory)
  return *watch;
}

CallWatch::CallWatch() : state_(std::make_unique<State>()) {
  state_->thread = std::thread([this] { loop(); });
  state_->thread.detach();
}

CallWatch::~CallWatch() = default;

CallWatch::Armed::~Armed() {
  if (id_ != 0) CallWatch::instance().disarm(id_);
}

CallWatch::Armed CallWatch::arm(pqxx::connection_base& conn, Clock::time_point deadline,
                                Owner owner) {
  return arm(conn, deadline, owner, {});
}

CallWatch::Armed CallWatch::arm(pqxx::connection_base& conn, Clock::time_point deadline,
                                Owner owner, std::function<Clock::time_point()> later) {
  last_call_id = 0;
  last_ending = Ending::none;
  const int fd = conn.sock();
  if (fd < 0) return Armed();
  auto& s = *state_;
  std::uint64_t id = 0;
  bool earliest = false;
  {
    std::lock_guard lock(s.mutex);
    id = s.next_id++;
    earliest = deadline < s.wakes_at;
    s.calls.push_back({id, fd, deadline, owner, std::move(later)});
    if (s.aborting.count(owner) != 0) {
      s.calls.back().aborted = true;
      s.cut_call(s.calls.back());
    }
  }
  last_call_id = id;
  if (earliest) s.cv.notify_all();
  return Armed(id);
}

void CallWatch::disarm(std::uint64_t id) {
  std::lock_guard lock(state_->mutex);
  auto& calls = state_->calls;
  if (id == last_call_id) {
    for (const auto& c : calls) {
      if (c.id == id && c.cut) last_ending = c.aborted ? Ending::aborted : Ending::deadline;
    }
  }
  calls.erase(
      std::remove_if(calls.begin(), calls.end(), [id](const State::Call& c) { return c.id == id; }),
      calls.end());
}

void CallWatch::abort(Owner owner) {
  std::lock_guard lock(state_->mutex);
  state_->aborting.insert(owner);
  for (auto& c : state_->calls) {
    if (c.owner == owner && !c.cut) {
      c.aborted = true;
      state_->cut_call(c);
    }
  }
}

void CallWatch::end_abort(Owner owner) {
  std::lock_guard lock(state_->mutex);
  const auto it = state_->aborting.find(owner);
  if (it != state_->aborting.end()) state_->aborting.erase(it);
}

bool CallWatch::aborting(Owner owner) const {
  std::lock_guard lock(state_->mutex);
  return state_->aborting.count(owner) != 0;
}

std::uint64_t CallWatch::cut() const {
  return state_->cut_count.load(std::memory_order_relaxed);
}

CallWatch::Ending CallWatch::last_call_ending() {
  Ending ending = std::exchange(last_ending, Ending::none);
  if (last_call_id != 0) {
    // Still armed (the guard outlives the failed call): ask the watch.
    std::lock_guard lock(state_->mutex);
    for (const auto& c : state_->calls) {
      if (c.id == last_call_id && c.cut) ending = c.aborted ? Ending::aborted : Ending::deadline;
    }
  }
  last_call_id = 0;
  return ending;
}

void CallWatch::forget_last_call() {
  last_call_id = 0;
  last_ending = Ending::none;
}

std::string failure_text(const std::exception& e) {
  const auto ending = CallWatch::instance().last_call_ending();
  if (is_connection_error(e)) {
    if (ending == CallWatch::Ending::deadline) {
      return "the call was cut at its deadline: the database, or the network to it, answered "
             "too slowly";
    }
    if (ending == CallWatch::Ending::aborted) {
      return "the call was cut as the node stopped or its leadership ended";
    }
    // libpqxx's words for a connection that libpq already found closed (reading a notification,
    // say) when the next call starts: the reason went with that earlier read. The second is
    // said by a call after that, on a connection that may not open a new session by itself
    // (detail::connect).
    const std::string_view what = e.what();
    if (what.find("Could not obtain client encoding") != std::string_view::npos ||
        what.find("reactivation is inhibited") != std::string_view::npos) {
      return "the connection to the database was lost (the server ended the session: a restart, "
             "a failover, a terminated backend; or the network dropped it)";
    }
  }
  return one_line(scrub(e.what()));
}

void CallWatch::loop() {
  auto& s = *state_;
  std::unique_lock lock(s.mutex);
  while (!s.stopping) {
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (auto& c : s.calls) {
      if (c.cut) continue;
      if (c.deadline <= now && c.later) c.deadline = c.later();
      if (c.deadline <= now) {
        s.cut_call(c);
      } else {
        next = std::min(next, c.deadline);
      }
    }
    // With nothing due soon, look again in 100 ms: a call armed meanwhile with a later
    // deadline is then found without waking the watchdog for it.
    s.wakes_at = std::min(next, now + std::chrono::milliseconds(100));
    s.cv.wait_until(lock, s.wakes_at);
  }
}

}  // namespace baton::detail
