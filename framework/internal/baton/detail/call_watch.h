// CallWatch: bounds the blocking database calls of a node. While a call is in flight (an Armed
// guard lives), the connection's socket is shut down when the call outlives its deadline, or at
// once when its owner is aborted (leadership lost, shutdown). libpq then fails the call as a lost
// connection, and the thread goes on: no thread waits on a network that stopped answering
// (packets dropped, a proxy that stalls) longer than its deadline, and revoke or shutdown never
// wait for one. The socket is shut down, never closed, so its number cannot be reused meanwhile.
//
// Thread-safety: every member may be called from any thread. One watchdog thread per process.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include <pqxx/connection_base>

namespace baton::detail {

class CallWatch {
 public:
  using Clock = std::chrono::steady_clock;
  using Owner = std::uintptr_t;  // groups calls that are aborted together (a component's address)

  static CallWatch& instance();

  // Disarms when destroyed: destroy it before the connection is closed or reused.
  class Armed {
   public:
    Armed() = default;
    Armed(Armed&& other) noexcept : id_(other.id_) { other.id_ = 0; }
    Armed& operator=(Armed&&) = delete;
    Armed(const Armed&) = delete;
    ~Armed();

   private:
    friend class CallWatch;
    explicit Armed(std::uint64_t id) : id_(id) {}
    std::uint64_t id_ = 0;
  };

  // Watches a call on `conn` until the guard is destroyed. A connection without a socket is not
  // watched.
  [[nodiscard]] Armed arm(pqxx::connection_base& conn, Clock::time_point deadline, Owner owner);
  // The same, with a deadline that may move: when `deadline` passes, `later()` (called on the
  // watchdog's thread, under its lock: it must be quick and must not arm or disarm) gives the
  // call's deadline now; the call is cut only once that has passed too.
  [[nodiscard]] Armed arm(pqxx::connection_base& conn, Clock::time_point deadline, Owner owner,
                          std::function<Clock::time_point()> later);
  [[nodiscard]] Armed arm(pqxx::connection_base& conn, std::chrono::milliseconds budget,
                          Owner owner) {
    return arm(conn, Clock::now() + budget, owner);
  }
  // Fails every call of `owner` that is in flight now, and any armed until end_abort(owner)
  // (so that a thread between two calls cannot slip past).
  void abort(Owner owner);
  void end_abort(Owner owner);
  // True between abort(owner) and end_abort(owner): for waits that have no socket to cut yet
  // (a connection being opened).
  bool aborting(Owner owner) const;
  // How many calls were cut short so far (for tests and logs).
  std::uint64_t cut() const;

  // How this thread's last watched call ended, as far as the watch knows: not cut, cut at its
  // deadline, or cut by abort(). Read once: it reads `none` afterwards, and after
  // forget_last_call().
  enum class Ending { none, deadline, aborted };
  Ending last_call_ending();
  // Forgets this thread's last watched call (a new connection: what failed next is not that
  // call's doing).
  static void forget_last_call();

  ~CallWatch();

 private:
  CallWatch();
  void disarm(std::uint64_t id);
  void loop();
  struct State;
  std::unique_ptr<State> state_;
};

// What a failed database call's exception says, for a log line: libpq's text, scrubbed of
// passwords and on one line, unless the call watch cut this thread's last call. libpq reports a
// cut as a lost connection, and libpqxx a connection already found closed as "Could not obtain
// client encoding: not connected.": neither tells an operator that baton ended the call, or
// that the server ended the session, nor why.
std::string failure_text(const std::exception& e);

// The owner id of a component.
inline CallWatch::Owner owner_of(const void* component) {
  return reinterpret_cast<CallWatch::Owner>(component);
}

}  // namespace baton::detail
