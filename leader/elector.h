// Elector: stands for leadership of (lock_key, region) and reports grants and revokes.
//
// Strategy (docs/concepts.md): a dedicated connection takes a session advisory lock (once), then
// upserts the lock row with epoch + 1 and renews the row's lease on a heartbeat. Followers try
// the lock every retry interval (25 ms), and now and then evict a holder whose row expired while
// its backend still holds the lock, and report a holder that is not a node at all.
//
// Lease ordering: the leader's own lease runs on its steady clock from the send time of its last
// successful renewal, and is shorter than every way the database can let another node lead (the
// session's idle_session_timeout, the server's TCP detection, the row's expiry). At its end a
// watchdog revokes at once, without waiting for a renewal stuck on a dead connection: that call
// has a deadline too (detail/call_watch.h).
//
// Thread-safety: every public member may be called from any thread. One heartbeat thread owns
// the connection; callbacks run on a separate event thread (which also keeps the lease's
// deadline), so a slow callback never delays renewal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "baton/config.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/db.h"
#include "baton/detail/lease.h"
#include "baton/detail/observer.h"
#include "baton/detail/waker.h"
#include "baton/events.h"

namespace baton::leader {

// What the nodes row says of this node (see ElectorConfig::node_state).
struct NodeRowState {
  std::string role;  // leader (of some shard) or follower
  std::int64_t epoch = 0;
  std::vector<int> shards_led;
};

struct ElectorConfig {
  detail::ConnectOptions connect;  // application_name must be "<node id>@<schema>"
  std::string node_id;
  std::string host;
  std::string version;
  std::string metrics_addr;          // recorded in the nodes row
  std::vector<std::string> handles;  // job types this node has handlers for (the nodes row)
  std::string lock_key = "baton-leader";
  std::string region = "default";
  Millis ttl{500};    // the lease on the database's side (row expiry, idle_session_timeout)
  Millis lease{395};  // the leader's own lease, shorter (NodeConfig::local_lease())
  Millis renew_interval{100};
  Millis retry_interval{100};
  // Shards (docs/concepts.md): a node runs one elector per shard, each with its own lock_key.
  // Only one of them writes the node's row, with what node_state() says (unset: this elector's
  // own leadership) and the group node_group names (empty: this elector's).
  int shards = 1;
  bool writes_node_row = true;
  std::function<NodeRowState()> node_state{};
  std::string node_group{};
  // Asked before every attempt to lead: false keeps this elector from standing (the node leads
  // its fair share already). Unset: always stands.
  std::function<bool()> may_stand{};
  // Told after each attempt that may_stand() allowed: whether it won the lock.
  std::function<void(bool won)> stood{};
  // With may_stand: whether a shard this node stands aside from may be held by a stranger (some
  // session holds its advisory lock and no lease on it is valid); only then is it looked at.
  std::function<bool()> may_be_stranger{};
  std::string label{};  // in log lines, before the epoch: "shard=3 "
};

// What the elector tells the node: leadership events, and the step-down requests the leader
// read from control_requests (the node drains, then calls yield()).
struct ElectorEvents {
  std::function<void(std::int64_t epoch)> granted;
  std::function<void(std::int64_t epoch, RevokeReason reason)> revoked;
  std::function<void(std::int64_t epoch)> step_down_requested;
};

class Elector {
 public:
  // `lease` is where the elector keeps this node's leadership for others to read; it must
  // outlive the Elector.
  Elector(ElectorConfig config, ElectorEvents events, detail::Lease& lease,
          detail::LeaderObserver* observer);
  ~Elector();
  Elector(const Elector&) = delete;
  Elector& operator=(const Elector&) = delete;

  void start();
  // Steps down if leading (lease ended, lock released, followers notified), delivers the revoke
  // event, and stops both threads. Idempotent.
  void stop();
  // Releases leadership now (if leading) and stays out of elections for a few renew intervals.
  // Given an epoch: only the lease of that epoch (a hand-over drained that one; a lease won since
  // is kept).
  void yield(std::int64_t epoch = 0);
  // The node's own step-down request: delivers step_down_requested (if leading), on the event
  // thread, so that the node drains before it calls yield().
  void request_step_down();

  // A follower tries for the lock now rather than at its next retry (a shard may have come free).
  void nudge();

  // True while the election session answered within the last `within`.
  bool reachable(Millis within) const;

 private:
  struct Event {
    enum Kind { granted, revoked, step_down } kind;
    std::int64_t epoch;
    std::optional<RevokeReason> reason{};  // revoked only
  };

  void heartbeat_loop();
  void event_loop();
  void step(pqxx::connection& conn, std::int64_t& held_epoch);
  // Tries the advisory lock; on success, grants. False when someone else holds it.
  bool acquire(pqxx::connection& conn, std::int64_t& held_epoch);
  void grant(pqxx::connection& conn, std::int64_t& held_epoch);
  void maybe_evict(pqxx::connection& conn);
  void renew(pqxx::connection& conn, std::int64_t& held_epoch);
  void release(pqxx::connection& conn, std::int64_t epoch, RevokeReason reason,
               bool shutdown = false);
  void touch_node_row(pqxx::connection& conn, bool force);
  void keep_alive(pqxx::connection& conn);
  void end_deposed_transactions(pqxx::connection& conn, const std::string& previous);
  void handle_notifications(pqxx::connection& conn, std::int64_t held_epoch);
  // Reads the step-down requests addressed to this leader (control_requests).
  void take_control_requests(pqxx::connection& conn, std::int64_t held_epoch);
  // Finds (and ends, where this role may) a session that holds the lock but is not a node.
  void check_lock_holder(pqxx::connection& conn);
  std::string group() const { return config_.region + "/" + config_.lock_key; }
  // Marks leadership lost and queues the event; false when it was lost already.
  // `why`, if any, follows the reason in the log line.
  bool revoke(std::int64_t epoch, RevokeReason reason, const std::string& why = {});
  // The lease of `epoch`, which ended at `deadline`, ran out: revokes it, saying why.
  void lease_ran_out(std::int64_t epoch, std::chrono::steady_clock::time_point deadline);
  void post(Event event);
  // Waits for the connection's socket (if any), the stop signal, or the timeout.
  void wait(int sock, Millis timeout);
  // The deadline of a statement: the lease's end while leading, else a retry interval plus
  // the lease (a follower's statements are short; a stuck one is cut).
  std::chrono::steady_clock::time_point statement_deadline(std::int64_t held_epoch) const;
  void answered();  // the server answered: the session is reachable

  // A statement of the heartbeat thread: watched until `deadline` and named, so that a lease that
  // runs out can say what the thread was waiting for.
  class Statement {
   public:
    // `shutdown`: one of the calls made after stop() (the release, the node row's last update):
    // stop() cuts the loop's calls in flight and any armed until the heartbeat has returned, so
    // these are watched under an owner of their own, bounded by their deadline alone.
    Statement(Elector& elector, pqxx::connection& conn,
              std::chrono::steady_clock::time_point deadline, const char* what,
              bool shutdown = false);
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    ~Statement();

   private:
    Elector& elector_;
    const int exceptions_ = std::uncaught_exceptions();
    detail::CallWatch::Armed armed_;
  };
  // Why the lease that ended at `deadline` ran out, as far as this process can tell (for the
  // log): how its time went between waiting for the database, the pauses between renewals and
  // this process's own work.
  std::string why_lease_ran_out(std::chrono::steady_clock::time_point deadline) const;
  // The lease now runs from `sent` (steady clock, ns), the send time of a renewal or grant whose
  // statement began with `in_statements_ns` spent in statements and `in_pauses_ns` in pauses so
  // far.
  void lease_from(std::int64_t sent_ns, std::int64_t in_statements_ns, std::int64_t in_pauses_ns);

  const ElectorConfig config_;
  const ElectorEvents on_;
  detail::LeaderObserver* const observer_;
  std::string handles_;  // config_.handles as a text[] literal

  detail::Lease& lease_;
  std::atomic<std::int64_t> last_answer_ns_{0};  // steady clock
  // Written by the heartbeat thread, read when the lease runs out (steady clock, ns): the
  // statement in flight (nullptr between statements) and its start; the last one that ended and
  // whether it failed; the time spent in statements so far, and in pauses between them (wait(),
  // each counted up to its timeout; the start of the one under way, 0 when none); the send time
  // of the renewal (or grant) the lease runs from and those totals then.
  std::atomic<const char*> doing_{nullptr};
  std::atomic<std::int64_t> doing_since_ns_{0};
  std::atomic<const char*> last_done_{nullptr};
  std::atomic<bool> last_failed_{false};
  std::atomic<std::int64_t> in_statements_ns_{0};
  std::atomic<std::int64_t> lease_from_ns_{0};
  std::atomic<std::int64_t> in_statements_at_lease_from_ns_{0};
  std::atomic<std::int64_t> in_pauses_ns_{0};
  std::atomic<std::int64_t> pausing_since_ns_{0};
  std::atomic<std::int64_t> in_pauses_at_lease_from_ns_{0};
  std::atomic<bool> stopping_{false};
  // A yield asked for: -1 (none), 0 (whatever is held), or the epoch to release.
  std::atomic<std::int64_t> yield_requested_{-1};
  std::chrono::steady_clock::time_point hold_off_until_{};  // heartbeat thread only
  detail::Waker waker_;

  std::mutex mutex_;  // guards events_ and events_done_
  std::condition_variable cv_;
  std::deque<Event> events_;
  bool events_done_ = false;
  // Set (under mutex_) when the heartbeat's loop has ended, before its shutdown statements.
  bool loop_ended_ = false;

  // Heartbeat thread only:
  std::chrono::steady_clock::time_point last_node_touch_{};
  std::chrono::steady_clock::time_point next_control_check_{};
  std::chrono::steady_clock::time_point next_step_down_allowed_{};
  std::chrono::steady_clock::time_point next_look_around_{};
  std::chrono::steady_clock::time_point next_aside_look_{};  // stranger check while aside
  int stranger_pid_ = 0;
  std::chrono::steady_clock::time_point stranger_since_{};
  std::chrono::steady_clock::time_point last_stranger_report_{};
  std::vector<std::string> notifications_;
  std::thread heartbeat_;
  std::thread events_thread_;
};

}  // namespace baton::leader
