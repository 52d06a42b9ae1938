// Elector: stands for leadership of (lock_key, region) and reports grants and revokes.
//
// Strategy (DESIGN.md section 4): a dedicated connection takes a session advisory lock once, then
// upserts the lock row with epoch + 1 and renews the row's lease on a heartbeat. A lost lease
// (zero rows, an error, EOF, or no successful renewal within the ttl measured on this process's
// steady clock from the send time of the last success) revokes at once and closes the connection,
// which frees the advisory lock. A follower tries every retry interval, wakes on the leader's
// release NOTIFY, and evicts a holder whose row expired while its backend still holds the lock.
//
// Thread-safety: every public member may be called from any thread. One heartbeat thread owns the
// connection; callbacks run on a separate event thread, so a slow callback never delays renewal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/observer.h"
#include "baton/events.h"

namespace baton::leader {

struct ElectorConfig {
  detail::ConnectOptions connect;  // application_name must be the node id
  std::string node_id;
  std::string host;
  std::string version;
  std::string metrics_addr;  // recorded in the nodes row
  std::string lock_key = "baton-leader";
  std::string region = "default";
  Millis ttl{2000};
  Millis renew_interval{200};
  Millis retry_interval{100};
};

class Elector {
 public:
  // `on_yield_request` runs on the event thread when someone asks this leader to step down
  // (NOTIFY "yield <node id>" or "yield *" on the leader channel, e.g. from batonctl); it should
  // drain and then call yield().
  Elector(ElectorConfig config, LeadershipCallbacks callbacks, detail::LeaderObserver* observer,
          std::function<void()> on_yield_request = {});
  ~Elector();
  Elector(const Elector&) = delete;
  Elector& operator=(const Elector&) = delete;

  void start();
  // Steps down if leading (lease ended, lock released, followers notified), delivers the revoke
  // callback, and stops both threads. Idempotent.
  void stop();
  // Releases leadership now (if leading) and stays out of elections for a few renew intervals.
  void yield();
  // Runs on_yield_request on the event thread (drain first, then yield), if leading.
  void request_yield();

  // True while this node leads at `epoch` and its lease has not run out on the steady clock.
  bool leading(std::int64_t epoch) const;
  bool is_leader() const;
  std::int64_t epoch() const;  // the epoch while leading, else 0
  // True while the election session is connected to the database.
  bool connected() const { return connected_.load(); }

 private:
  struct Event {
    enum Kind { granted, revoked, yield_request } kind;
    std::int64_t epoch;
    RevokeReason reason;
  };

  void heartbeat_loop();
  void event_loop();
  void step(pqxx::connection& conn, std::int64_t& held_epoch);
  bool try_acquire(pqxx::connection& conn, std::int64_t& held_epoch);
  void maybe_evict(pqxx::connection& conn);
  void renew(pqxx::connection& conn, std::int64_t& held_epoch);
  void release(pqxx::connection& conn, std::int64_t epoch);
  void touch_node_row(pqxx::connection& conn, bool force);
  void end_deposed_transactions(pqxx::connection& conn, const std::string& previous);
  void handle_notifications(pqxx::connection& conn, std::int64_t held_epoch);
  // Marks leadership lost and queues the callback; false when it was lost already.
  bool revoke(std::int64_t epoch, RevokeReason reason);
  void post(Event event);
  // Waits for the connection's socket (if any), the stop signal, or the timeout.
  void wait(int sock, Millis timeout);

  const ElectorConfig config_;
  const LeadershipCallbacks callbacks_;
  const std::function<void()> on_yield_request_;
  detail::LeaderObserver* const observer_;

  std::atomic<std::int64_t> epoch_{0};              // 0 when not leading
  std::atomic<std::int64_t> lease_deadline_ns_{0};  // steady clock
  std::atomic<bool> stopping_{false};
  std::atomic<bool> connected_{false};
  std::atomic<bool> yield_requested_{false};
  std::chrono::steady_clock::time_point hold_off_until_{};  // heartbeat thread only
  int wake_fd_ = -1;

  std::mutex mutex_;  // guards events_
  std::condition_variable cv_;
  std::deque<Event> events_;
  bool events_done_ = false;

  std::chrono::steady_clock::time_point last_node_touch_{};
  std::vector<std::string> notifications_;  // heartbeat thread only
  std::thread heartbeat_;
  std::thread events_thread_;
};

}  // namespace baton::leader
