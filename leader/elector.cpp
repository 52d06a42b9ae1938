// Election by lock row + advisory lock + heartbeat (see elector.h for the strategy).
#include "leader/elector.h"

#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "baton/detail/backoff.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/clock.h"
#include "baton/detail/control.h"
#include "baton/detail/text.h"

namespace baton::leader {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A leader honours at most one step-down request this often: a script in a loop (or a role
// that may write control_requests, misused) cannot keep the cluster without a leader.
constexpr auto kStepDownInterval = std::chrono::seconds(10);

// The advisory key is derived on the server from the schema (advisory locks are database-wide,
// and two deployments may share a database in different schemas), region and lock_key.
#define BATON_LOCK_KEY(region, lock_key) \
  "hashtextextended(current_schema() || '/' || " region " || '/' || " lock_key ", 0)"
constexpr const char* kTryLockSql = "SELECT pg_try_advisory_lock(" BATON_LOCK_KEY("$1", "$2") ")";

// How often a follower looks for a stale holder or a stranger (heavier queries than the try).
constexpr auto kLookAround = std::chrono::milliseconds(100);

// Epochs come from one sequence (sql/0012_shards.sql), so they never repeat across the rows of a
// deployment's shards (a node that leads two shards tells their runs apart by epoch). A row whose
// epoch is ahead of the sequence (granted by a node of an older version during an upgrade, or
// written by hand) still gets a larger one, and only then is the sequence moved past it: an
// unconditional setval() could move it back under a concurrent grant of another shard. One window
// is left: a grant of another shard between this one's nextval() and setval() may draw a value
// up to the row's; that needs a row ahead of the sequence, which only a node without shards (an
// older version, or a hand edit) writes, so a deployment that runs shards catches up on its
// first grants (shard 0's, at the latest) and never again.
// Returns the new epoch and the previous holder (NULL on the very first grant). Nothing when
// this backend does not hold the advisory lock: the statement ran on another server session than
// the lock (a transaction pooler), and granting would make two leaders. The grant's row in the
// leadership timeline is written in the same transaction, with why the lock was free.
constexpr const char* kGrantSql = R"sql(
WITH previous AS (
  SELECT client_id, epoch, renewed_at, expires_at FROM locks WHERE lock_key = $1 AND region = $2),
mine AS (
  SELECT 1 FROM pg_catalog.pg_locks p, (SELECT )sql" BATON_LOCK_KEY("$2", "$1") R"sql( AS key) k
   WHERE p.locktype = 'advisory' AND p.granted AND p.pid = pg_backend_pid() AND p.objsubid = 1
     AND p.classid = ((k.key >> 32) & 4294967295)::oid AND p.objid = (k.key & 4294967295)::oid),
granted AS (
  INSERT INTO locks AS l (lock_key, region, client_id, created_date, epoch, renewed_at,
                          expires_at, holder_pid, holder_host)
  SELECT $1, $2, $3, now(),
         (SELECT CASE WHEN a.after > s.next THEN setval('epochs', a.after) ELSE s.next END
            FROM (SELECT nextval('epochs') AS next) s,
                 (SELECT coalesce(max(epoch) + 1, 0) AS after FROM previous) a),
         clock_timestamp(),
         clock_timestamp() + $4::bigint * interval '1 millisecond', pg_backend_pid(), $5
   WHERE EXISTS (SELECT 1 FROM mine)
  ON CONFLICT (lock_key, region) DO UPDATE
     SET client_id = excluded.client_id, created_date = excluded.created_date,
         epoch = excluded.epoch, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
         holder_pid = excluded.holder_pid, holder_host = excluded.holder_host
  RETURNING epoch),
logged AS (
  INSERT INTO leadership_events (lock_key, region, epoch, node_id, host, event, reason,
                                 previous_node, previous_epoch, previous_renewed_s_ago)
  SELECT $1, $2, g.epoch, $3, $5, 'granted',
         CASE WHEN p.client_id IS NULL THEN 'first'
              WHEN p.client_id = $3 THEN 'again'
              WHEN p.expires_at <= p.renewed_at THEN 'after_release'
              WHEN p.expires_at <= clock_timestamp() THEN 'lease_expired'
              ELSE 'session_ended' END,
         p.client_id, p.epoch, extract(epoch FROM clock_timestamp() - p.renewed_at)::float8
    FROM granted g LEFT JOIN previous p ON true)
SELECT g.epoch, p.client_id, extract(epoch FROM clock_timestamp() - p.renewed_at)::float8
  FROM granted g LEFT JOIN previous p ON true
)sql";

// A deposed leader that froze may have transactions open (a transactional handler between its
// writes and its commit). Ending them releases their row locks so that the rescue can proceed;
// their commits would be fenced anyway. Not while that node still holds a lease (on another
// shard): its transactions may be that shard's.
constexpr const char* kEndDeposedSql = R"sql(
SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(pid))
  FROM pg_catalog.pg_stat_activity
 WHERE application_name = $1 AND datname = current_database()
   AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()
   AND NOT EXISTS (SELECT 1 FROM locks WHERE client_id = $2 AND expires_at > clock_timestamp())
)sql";

// Only from the session that holds the lock (holder_pid): a renewal that a transaction pooler
// ran on another server session renews nothing.
constexpr const char* kRenewSql = R"sql(
UPDATE locks SET renewed_at = clock_timestamp(),
                 expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond'
 WHERE lock_key = $1 AND region = $2 AND client_id = $3 AND epoch = $4
   AND holder_pid = pg_backend_pid()
)sql";

// The release ends the row's lease at its renewal time (so the next grant reads it as released)
// and writes the timeline's row; $5 is the revoke reason.
constexpr const char* kReleaseRowSql = R"sql(
WITH released AS (
  UPDATE locks SET expires_at = renewed_at
   WHERE lock_key = $1 AND region = $2 AND client_id = $3 AND epoch = $4
  RETURNING epoch, holder_host)
INSERT INTO leadership_events (lock_key, region, epoch, node_id, host, event, reason)
SELECT $1, $2, epoch, $3, holder_host, 'released', $5 FROM released
)sql";

constexpr const char* kUnlockSql = "SELECT pg_advisory_unlock(" BATON_LOCK_KEY("$1", "$2") ")";

// A holder is stale when its lease expired on the database clock while its backend still holds
// the advisory lock (a frozen process, or a half-open connection the server has not noticed).
constexpr const char* kStaleHolderSql = R"sql(
SELECT l.client_id, l.holder_pid, l.epoch
  FROM locks l, (SELECT )sql" BATON_LOCK_KEY("$2", "$1") R"sql( AS key) k
 WHERE l.lock_key = $1 AND l.region = $2 AND l.expires_at < clock_timestamp()
   AND EXISTS (
     SELECT 1 FROM pg_catalog.pg_locks p
      WHERE p.locktype = 'advisory' AND p.granted AND p.pid = l.holder_pid AND p.objsubid = 1
        AND p.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
        AND p.classid = ((k.key >> 32) & 4294967295)::oid AND p.objid = (k.key & 4294967295)::oid)
)sql";

// Ends every backend of the stale node (application_name "<node id>@<schema>"), not only its
// election session, so that its open transactions end too.
constexpr const char* kEvictSql = R"sql(
SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(pid))
  FROM pg_catalog.pg_stat_activity
 WHERE ((application_name = $1 AND datname = current_database()) OR pid = $2)
   AND pid <> pg_backend_pid()
)sql";

// The session holding this group's advisory lock when it is not the lock row's holder and the
// row's lease ran out more than a ttl ago (or there is no row): no node leads, and something that
// is not a node (a stranger that computed the key, or a stuck client) keeps every node out.
constexpr const char* kStrangerSql = R"sql(
SELECT p.pid, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''),
       coalesce(host(a.client_addr), 'local')
  FROM pg_catalog.pg_locks p
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = p.pid,
       (SELECT )sql" BATON_LOCK_KEY("$2", "$1") R"sql( AS key) k
  LEFT JOIN locks l ON l.lock_key = $1 AND l.region = $2
 WHERE p.locktype = 'advisory' AND p.granted AND p.objsubid = 1
   AND p.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
   AND p.classid = ((k.key >> 32) & 4294967295)::oid AND p.objid = (k.key & 4294967295)::oid
   AND p.pid <> pg_backend_pid()
   AND (l.lock_key IS NULL
        OR (l.expires_at < clock_timestamp() - $3::bigint * interval '1 millisecond'
            AND p.pid IS DISTINCT FROM l.holder_pid))
)sql";

constexpr const char* kNodeRowSql = R"sql(
INSERT INTO nodes AS n (node_id, host, pid, version, role, epoch, metrics_addr, lock_group,
                        handles, shards, shards_led)
VALUES ($1, $2, $3, $4, $5, nullif($6, 0), nullif($7, ''), $8, $9::text[], $10, $11::int[])
ON CONFLICT (node_id) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, version = excluded.version,
       last_seen = now(), role = excluded.role, epoch = coalesce(excluded.epoch, n.epoch),
       metrics_addr = excluded.metrics_addr, lock_group = excluded.lock_group,
       handles = excluded.handles, shards = excluded.shards, shards_led = excluded.shards_led,
       started_at = CASE WHEN n.pid = excluded.pid THEN n.started_at ELSE now() END
)sql";

// LISTENs on the leader channel and keeps the payloads (detail/control.h): a payload only wakes
// the elector; what it may do is read from the database.
struct WakeReceiver : pqxx::notification_receiver {
  WakeReceiver(pqxx::connection_base& conn, const std::string& channel,
               std::vector<std::string>& out)
      : pqxx::notification_receiver(conn, channel), out_(out) {}
  void operator()(const std::string& payload, int) override { out_.push_back(payload); }
  std::vector<std::string>& out_;
};

}  // namespace

Elector::Elector(ElectorConfig config, ElectorEvents events, detail::Lease& lease,
                 detail::LeaderObserver* observer)
    : config_(std::move(config)), on_(std::move(events)), observer_(observer), lease_(lease) {
  // The handled types as a text[] literal (type names follow the naming rule: no quoting needed
  // beyond the double quotes).
  handles_ = "{";
  for (const auto& t : config_.handles)
    handles_ += (handles_.size() > 1 ? ",\"" : "\"") + t + "\"";
  handles_ += "}";
}

Elector::~Elector() {
  stop();
}

void Elector::start() {
  events_thread_ = std::thread([this] { event_loop(); });
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

void Elector::stop() {
  if (stopping_.exchange(true)) return;
  waker_.wake();
  // The heartbeat ends the statement in flight (its deadline bounds it), then releases the lock
  // and marks the node row stopped. Cutting that statement at once would lose the connection
  // those need: the loop gets a lease's time to end. Past that, whatever the loop is stuck in
  // (a connection being opened to a server that does not answer) is cut.
  if (heartbeat_.joinable()) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, config_.lease, [&] { return loop_ended_; });
  }
  detail::CallWatch::instance().abort(detail::owner_of(this));
  if (heartbeat_.joinable()) heartbeat_.join();
  detail::CallWatch::instance().end_abort(detail::owner_of(this));
  {
    std::lock_guard lock(mutex_);
    events_done_ = true;
  }
  cv_.notify_all();
  if (events_thread_.joinable()) events_thread_.join();
}

void Elector::yield(std::int64_t epoch) {
  // Requests merge: any epoch (0) wins over one epoch, a later epoch over an earlier one, so a
  // stale hand-over's request never drops a step-down's.
  auto seen = yield_requested_.load();
  while (seen != 0 && (epoch == 0 || epoch > seen) &&
         !yield_requested_.compare_exchange_weak(seen, epoch)) {
  }
  waker_.wake();
}

void Elector::nudge() {
  if (lease_.epoch() == 0) waker_.wake();
}

void Elector::request_step_down() {
  const auto e = lease_.epoch();
  if (e != 0) post({Event::step_down, e});
}

bool Elector::reachable(Millis within) const {
  const auto at = last_answer_ns_.load();
  return at != 0 && detail::steady_now_ns() - at < std::chrono::nanoseconds(within).count();
}

void Elector::answered() {
  last_answer_ns_.store(detail::steady_now_ns());
}

Elector::Statement::Statement(Elector& elector, pqxx::connection& conn, Clock::time_point deadline,
                              const char* what, bool shutdown)
    : elector_(elector),
      armed_(detail::CallWatch::instance().arm(
          conn, deadline,
          shutdown ? detail::owner_of(&elector.stopping_) : detail::owner_of(&elector))) {
  elector_.doing_since_ns_.store(detail::steady_now_ns());
  elector_.doing_.store(what);
}

Elector::Statement::~Statement() {
  elector_.in_statements_ns_.fetch_add(detail::steady_now_ns() - elector_.doing_since_ns_.load());
  elector_.last_failed_.store(std::uncaught_exceptions() > exceptions_);
  elector_.last_done_.store(elector_.doing_.exchange(nullptr));
}

void Elector::lease_ran_out(std::int64_t epoch, Clock::time_point deadline) {
  const auto why = fmt::format("no renewal came back within {} ms; {}", config_.lease.count(),
                               why_lease_ran_out(deadline));
  if (revoke(epoch, RevokeReason::lost_renewal, why) && observer_ != nullptr) {
    observer_->renewal_failed();
  }
}

void Elector::lease_from(std::int64_t sent_ns, std::int64_t in_statements_ns,
                         std::int64_t in_pauses_ns) {
  in_statements_at_lease_from_ns_.store(in_statements_ns);
  in_pauses_at_lease_from_ns_.store(in_pauses_ns);
  lease_from_ns_.store(sent_ns);
}

std::string Elector::why_lease_ran_out(Clock::time_point deadline) const {
  // Read while the heartbeat may go on: what is under way before the totals (a statement or pause
  // that ends in between is then counted twice, never missed, and the clamps below bound it), the
  // lease's start, and the clock last.
  const char* what = doing_.load();
  const auto since = doing_since_ns_.load();
  const auto pausing = pausing_since_ns_.load();
  auto waited = in_statements_ns_.load() - in_statements_at_lease_from_ns_.load();
  auto paused = in_pauses_ns_.load() - in_pauses_at_lease_from_ns_.load();
  const auto from = lease_from_ns_.load();
  const auto now = detail::steady_now_ns();
  const auto late = std::chrono::duration_cast<Millis>(Clock::now() - deadline);
  if (what != nullptr) waited += now - since;
  // A leader pauses a renewal interval at a time.
  if (pausing != 0) {
    paused += std::min<std::int64_t>(now - pausing,
                                     std::chrono::nanoseconds(config_.renew_interval).count());
  }
  const auto span = std::max<std::int64_t>(now - from, 0);
  waited = std::clamp<std::int64_t>(waited, 0, span);
  paused = std::clamp<std::int64_t>(paused, 0, span - waited);
  const auto own = span - waited - paused;
  const auto ms = [](std::int64_t ns) { return ns / 1'000'000; };
  std::string why = fmt::format(
      "of the {} ms since the renewal (or grant) it ran from was sent, {} ms went waiting for the "
      "database, {} ms to its pauses between renewals and {} ms to this process",
      ms(span), ms(waited), ms(paused), ms(own));
  if (what != nullptr) {
    why += fmt::format(" (its {} has waited {} ms)", what, ms(now - since));
  } else if (const char* last = last_done_.load(); last != nullptr && last_failed_.load()) {
    why += fmt::format(" (its {} ended without an answer)", last);
  }
  // The pauses are the lease's design (it covers three renewal intervals): what is left is
  // either the database's time or this process's.
  if (late >= config_.renew_interval) {
    why += fmt::format(
        ": this process did not run for a while (the lease's end was seen {} ms late), so it "
        "was stopped or starved of CPU",
        late.count());
  } else if (waited >= own) {
    why +=
        ": the database, or the network to it, answered too slowly (see the server's CPU, I/O "
        "and wait events)";
  } else {
    why += ": this process was slow between statements: it got no CPU or was stopped";
  }
  return why;
}

Clock::time_point Elector::statement_deadline(std::int64_t held_epoch) const {
  if (held_epoch != 0 && lease_.epoch() == held_epoch) return lease_.deadline();
  return Clock::now() + config_.retry_interval + config_.lease;
}

bool Elector::revoke(std::int64_t epoch, RevokeReason reason, const std::string& why) {
  if (!lease_.end(epoch)) return false;
  // Reported before anything else: from this instant this node says it does not lead.
  if (observer_ != nullptr) observer_->revoked(epoch, to_string(reason));
  if (reason == RevokeReason::shutting_down || reason == RevokeReason::stepped_down) {
    spdlog::info("leadership released: {}epoch={} reason={}", config_.label, epoch,
                 to_string(reason));
  } else {
    spdlog::warn("leadership LOST: {}epoch={} reason={}{}{}", config_.label, epoch,
                 to_string(reason), why.empty() ? "" : ": ", why);
  }
  post({Event::revoked, epoch, reason});
  // Whatever the heartbeat is waiting for on the network is of no use any more.
  detail::CallWatch::instance().abort(detail::owner_of(this));
  detail::CallWatch::instance().end_abort(detail::owner_of(this));
  return true;
}

void Elector::post(Event event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
  }
  cv_.notify_all();
}

void Elector::event_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // The lease's end is kept here, to the millisecond, whatever the heartbeat thread is doing
    // (a renewal stuck on a dead connection cannot delay it).
    const auto wake =
        lease_.epoch() != 0 ? lease_.deadline() : Clock::now() + config_.renew_interval;
    cv_.wait_until(lock, wake, [this] { return !events_.empty() || events_done_; });
    // The epoch first: a grant stores its deadline before its epoch, so the deadline read after
    // it is that epoch's or a later one's, never an earlier lease's (which would end a new lease
    // at once). Zero: the epoch ended meanwhile.
    const auto e = lease_.epoch();
    const auto deadline = lease_.deadline();
    if (e != 0 && deadline != Clock::time_point{} && Clock::now() >= deadline) {
      lock.unlock();
      lease_ran_out(e, deadline);
      lock.lock();
    }
    while (!events_.empty()) {
      Event ev = events_.front();
      events_.pop_front();
      lock.unlock();
      try {
        if (ev.kind == Event::granted && on_.granted) on_.granted(ev.epoch);
        if (ev.kind == Event::revoked && on_.revoked) on_.revoked(ev.epoch, *ev.reason);
        if (ev.kind == Event::step_down) {
          if (on_.step_down_requested) {
            on_.step_down_requested(ev.epoch);
          } else {
            yield();
          }
        }
      } catch (const std::exception& ex) {
        spdlog::error("leadership callback threw: {}", ex.what());
      }
      lock.lock();
    }
    if (events_done_) return;
  }
}

void Elector::wait(int sock, Millis timeout) {
  const auto from = detail::steady_now_ns();
  pausing_since_ns_.store(from);
  waker_.wait(sock, timeout);
  // A pause counts up to its timeout; a wait that came back later than that was this process
  // not running (it counts as its own time).
  const auto took = detail::steady_now_ns() - from;
  in_pauses_ns_.fetch_add(std::min<std::int64_t>(took, std::chrono::nanoseconds(timeout).count()));
  pausing_since_ns_.store(0);
}

void Elector::heartbeat_loop() {
  std::unique_ptr<pqxx::connection> conn;
  std::unique_ptr<WakeReceiver> receiver;  // declared after conn: destroyed before it
  std::int64_t held_epoch = 0;             // the epoch this thread holds the advisory lock for
  detail::Backoff backoff(Millis(100), Millis(2000));
  bool reported_down = false;
  auto connect_options = config_.connect;
  // The election session: the server ends it when it falls silent for the database-side lease
  // (which frees the lock), and finds a dead peer no sooner; a statement may take the leader's
  // own lease at most.
  const int ttl_ms = static_cast<int>(config_.ttl.count());
  connect_options.idle_session_timeout_ms = ttl_ms;
  connect_options.idle_in_transaction_timeout_ms = ttl_ms;
  connect_options.server_keepalive_ms = ttl_ms;
  connect_options.statement_timeout_ms = static_cast<int>(config_.lease.count());
  connect_options.lock_timeout_ms = static_cast<int>(config_.lease.count());
  connect_options.synchronous_commit_off = true;  // the lease lives in memory: no fsync wait

  while (!stopping_.load()) {
    try {
      if (!conn) {
        // Checked on every (re)connect: the URL's name may lead to a pooler now.
        if (const auto pooled =
                detail::transaction_pooling(config_.connect, detail::owner_of(this));
            !pooled.empty()) {
          throw std::runtime_error(pooled);
        }
        conn = detail::connect(connect_options, detail::owner_of(this));
        answered();
        // Followers wake at once when a leader releases its lock.
        receiver = std::make_unique<WakeReceiver>(
            *conn, detail::leader_channel(config_.connect.schema), notifications_);
        if (reported_down) spdlog::info("election connection restored");
        reported_down = false;
        backoff.reset();
        touch_node_row(*conn, true);
      }
      step(*conn, held_epoch);
    } catch (const std::exception& e) {
      if (held_epoch != 0) {
        // A statement cut at the lease's end fails here at the watchdog's instant: whichever
        // comes first reports the lease that ran out.
        const auto deadline = lease_.deadline();
        if (lease_.epoch() == held_epoch && deadline != Clock::time_point{} &&
            Clock::now() >= deadline) {
          lease_ran_out(held_epoch, deadline);
        } else {
          revoke(held_epoch, RevokeReason::connection_lost);
        }
        held_epoch = 0;
      }
      receiver.reset();
      conn.reset();  // closing the session frees the advisory lock
      if (observer_ != nullptr) {
        observer_->database_error("elector");
        if (detail::is_authentication_error(e)) observer_->authentication_failed();
      }
      if (!reported_down) {
        spdlog::error("election connection failed: {}; reconnecting with backoff",
                      detail::failure_text(e));
        reported_down = true;
      }
      wait(-1, backoff.next_jittered());
    }
  }
  {
    std::lock_guard lock(mutex_);
    loop_ended_ = true;
  }
  cv_.notify_all();

  // Shutting down: release leadership so that a follower takes over within milliseconds.
  if (held_epoch != 0) {
    revoke(held_epoch, RevokeReason::shutting_down);
    if (conn) {
      try {
        release(*conn, held_epoch, RevokeReason::shutting_down, true);
      } catch (const std::exception& e) {
        spdlog::warn("could not release leadership cleanly ({}); closing the session frees it",
                     detail::failure_text(e));
      }
    }
  }
  if (conn && config_.writes_node_row) {
    try {
      receiver.reset();
      Statement armed(*this, *conn, Clock::now() + config_.lease, "node row's last update", true);
      pqxx::nontransaction tx(*conn);
      tx.exec_params("UPDATE nodes SET role = 'stopped', last_seen = now() WHERE node_id = $1",
                     config_.node_id);
    } catch (const std::exception&) {
      // The row ages out by last_seen anyway.
    }
  }
}

void Elector::step(pqxx::connection& conn, std::int64_t& held_epoch) {
  if (held_epoch != 0 && lease_.epoch() != held_epoch) {
    // The watchdog revoked the lease while this thread was busy: give the lock up for real.
    throw std::runtime_error("lease ran out before renewal succeeded");
  }
  if (const auto asked = held_epoch != 0 ? yield_requested_.exchange(-1) : -1;
      asked == 0 || asked == held_epoch) {
    const auto epoch = held_epoch;
    held_epoch = 0;
    revoke(epoch, RevokeReason::stepped_down);
    release(conn, epoch, RevokeReason::stepped_down);
    // Stay out long enough for a follower to win, or the same node would simply win again.
    hold_off_until_ = Clock::now() + 2 * config_.renew_interval + 2 * config_.retry_interval;
    touch_node_row(conn, true);
    return;
  }
  if (held_epoch == 0) {
    yield_requested_.store(-1);
    if (Clock::now() < hold_off_until_ || (config_.may_stand && !config_.may_stand())) {
      touch_node_row(conn, false);
      // A shard this node does not stand for may still be held by a stranger (a session that is
      // no node, before any node wrote the shard's lock row): looked for now and then.
      // (Also while one is reported, so that its end is seen.)
      if (config_.may_stand && Clock::now() >= next_aside_look_ &&
          (!config_.may_be_stranger || stranger_pid_ != 0 || config_.may_be_stranger())) {
        next_aside_look_ = Clock::now() + std::chrono::seconds(1);
        check_lock_holder(conn);
      }
      keep_alive(conn);
      wait(conn.sock(), config_.retry_interval);
      handle_notifications(conn, held_epoch);
      return;
    }
    bool won = false;
    try {
      won = acquire(conn, held_epoch);
    } catch (...) {
      if (config_.stood) config_.stood(false);  // the next elector need not wait for the limit
      throw;
    }
    if (config_.stood) config_.stood(won);
    if (won && stranger_pid_ != 0) {
      // The stranger it reported is gone: the lock is this node's now.
      stranger_pid_ = 0;
      spdlog::info("the leader lock is no longer held by a stranger");
      if (observer_ != nullptr) observer_->stranger_holds_lock(false);
    }
    if (!won) {
      if (Clock::now() >= next_look_around_) {
        next_look_around_ = Clock::now() + kLookAround;
        maybe_evict(conn);
        check_lock_holder(conn);
      }
      touch_node_row(conn, false);
      wait(conn.sock(), config_.retry_interval);
      handle_notifications(conn, held_epoch);
    }
    return;
  }
  renew(conn, held_epoch);
  touch_node_row(conn, false);
  wait(conn.sock(), config_.renew_interval);
  handle_notifications(conn, held_epoch);
}

void Elector::keep_alive(pqxx::connection& conn) {
  // The server ends an election session silent for the ttl (idle_session_timeout): one that
  // stands aside (its node leads its share already) says something every renew interval.
  const auto last =
      std::chrono::steady_clock::time_point(std::chrono::nanoseconds(last_answer_ns_.load()));
  if (Clock::now() - last < config_.renew_interval) return;
  Statement armed(*this, conn, statement_deadline(0), "keep-alive");
  pqxx::nontransaction tx(conn);
  tx.exec("SELECT 1");
  answered();
}

void Elector::handle_notifications(pqxx::connection& conn, std::int64_t held_epoch) {
  notifications_.clear();
  conn.get_notifs();  // throws when the server closed the session
  bool control = false;
  for (const auto& payload : notifications_) {
    const auto signal = detail::LeaderSignal::parse(payload);
    control = control || (signal && signal->kind == detail::LeaderSignal::control);
  }
  // A NOTIFY is only a wake-up (anyone may send one): the requests are read from their table.
  if (held_epoch != 0 && (control || Clock::now() >= next_control_check_)) {
    take_control_requests(conn, held_epoch);
  }
}

bool Elector::acquire(pqxx::connection& conn, std::int64_t& held_epoch) {
  // Tried every retry interval (25 ms by default), not waited for in pg_advisory_lock: a blocked
  // lock wait holds a snapshot for as long as it waits (pg_stat_activity.backend_xmin), and a
  // follower that waited for hours would hold back VACUUM on the job tables all that time.
  {
    Statement armed(*this, conn, statement_deadline(0), "lock attempt");
    pqxx::nontransaction tx(conn);
    const bool got = tx.exec_params(kTryLockSql, config_.region, config_.lock_key)[0][0].as<bool>();
    answered();
    if (!got) return false;
  }
  grant(conn, held_epoch);
  return true;
}

void Elector::grant(pqxx::connection& conn, std::int64_t& held_epoch) {
  const auto sent = Clock::now();
  const auto sent_ns = detail::steady_now_ns();
  const auto in_statements = in_statements_ns_.load();
  const auto in_pauses = in_pauses_ns_.load();
  std::int64_t epoch = 0;
  std::string previous;
  double failover_seconds = -1.0;
  {
    // If this fails, the caller drops the session, so the advisory lock is never held without
    // the row. (Its own block: the statements after it are recorded as their own.)
    Statement armed(*this, conn, statement_deadline(0), "grant");
    pqxx::work tx(conn);
    // Renewals may be lost in a crash (the session commits asynchronously), a grant may not: an
    // epoch lost and issued again would let a deposed leader's claim tokens match a new claim's.
    // With a synchronous standby this also waits until the standby has the grant.
    tx.exec("SET LOCAL synchronous_commit = on");
    const auto rows = tx.exec_params(kGrantSql, config_.lock_key, config_.region, config_.node_id,
                                     static_cast<std::int64_t>(config_.ttl.count()), config_.host);
    if (rows.empty()) {
      throw std::runtime_error(
          "the grant ran on another server session than the one holding the lock: the election "
          "connection goes through a transaction pooler (PgBouncer pool_mode=transaction?). "
          "Connect nodes directly or through a session-mode pool, or give "
          "--election-database-url a direct URL");
    }
    const auto row = rows[0];
    epoch = row[0].as<std::int64_t>();
    previous = row[1].is_null() ? "" : row[1].c_str();
    if (!previous.empty() && previous != config_.node_id && !row[2].is_null()) {
      failover_seconds = row[2].as<double>();
    }
    tx.commit();
    answered();
  }
  held_epoch = epoch;
  lease_from(sent_ns, in_statements, in_pauses);
  lease_.grant(epoch, sent + config_.lease);
  {
    std::lock_guard lock(mutex_);  // the watchdog picks up the new deadline
  }
  cv_.notify_all();
  spdlog::info("leadership GRANTED: {}epoch={}", config_.label, epoch);
  if (observer_ != nullptr) observer_->granted(epoch, failover_seconds);
  post({Event::granted, epoch});
  touch_node_row(conn, true);
  if (!previous.empty() && previous != config_.node_id) end_deposed_transactions(conn, previous);
}

void Elector::take_control_requests(pqxx::connection& conn, std::int64_t held_epoch) {
  next_control_check_ = Clock::now() + std::chrono::seconds(1);
  const bool may_accept = Clock::now() >= next_step_down_allowed_;
  Statement armed(*this, conn, statement_deadline(held_epoch), "step-down request check");
  for (const auto& r :
       detail::take_control(conn, config_.node_id, group(), may_accept, std::chrono::seconds(60))) {
    spdlog::info("step-down request {} from role {}{}: {}", r.id, r.requested_by,
                 r.note.empty() ? "" : " (" + detail::one_line(r.note, 200) + ")", r.outcome);
    if (r.accepted) {
      next_step_down_allowed_ = Clock::now() + kStepDownInterval;
      post({Event::step_down, held_epoch});
    }
  }
}

void Elector::check_lock_holder(pqxx::connection& conn) {
  Statement armed(*this, conn, statement_deadline(0), "lock holder check");
  pqxx::nontransaction tx(conn);
  auto r = tx.exec_params(kStrangerSql, config_.lock_key, config_.region,
                          static_cast<std::int64_t>(config_.ttl.count()));
  if (r.empty()) {
    if (stranger_pid_ != 0) {
      spdlog::info("the leader lock is no longer held by a stranger");
      if (observer_ != nullptr) observer_->stranger_holds_lock(false);
    }
    stranger_pid_ = 0;
    return;
  }
  const int pid = r[0][0].as<int>();
  if (pid != stranger_pid_) {
    // Seen once: a node may hold the lock for a moment before it writes the lock row.
    stranger_pid_ = pid;
    stranger_since_ = Clock::now();
    return;
  }
  if (Clock::now() - stranger_since_ < std::max<Clock::duration>(config_.ttl, 1s)) return;
  const std::string who = std::string("pid=") + r[0][0].c_str() + " role=" + r[0][1].c_str() +
                          " application_name='" + detail::one_line(r[0][2].c_str(), 64) +
                          "' client=" + r[0][3].c_str();
  if (observer_ != nullptr) observer_->stranger_holds_lock(true);
  try {
    tx.exec_params("SELECT pg_catalog.pg_terminate_backend($1)", pid);
    spdlog::error(
        "the leader lock was held by a session that is not a baton node ({}) while no node "
        "led; ended it",
        who);
    if (observer_ != nullptr) observer_->evicted_holder();
  } catch (const pqxx::sql_error& e) {
    if (last_stranger_report_ + std::chrono::seconds(30) <= Clock::now()) {
      spdlog::error(
          "the leader lock is held by a session that is not a baton node ({}), so no node can "
          "lead; this node's role may not end it ({}): end it by hand "
          "(SELECT pg_terminate_backend({})), and grant pg_signal_backend to the node role "
          "(docs/security.md)",
          who, detail::one_line(e.what(), 200), pid);
      last_stranger_report_ = Clock::now();
    }
  }
}

void Elector::maybe_evict(pqxx::connection& conn) {
  Statement armed(*this, conn, statement_deadline(0), "stale leader check");
  pqxx::nontransaction tx(conn);
  auto stale = tx.exec_params(kStaleHolderSql, config_.lock_key, config_.region);
  answered();
  if (stale.empty()) return;
  const std::string holder = stale[0][0].c_str();
  const int pid = stale[0][1].is_null() ? 0 : stale[0][1].as<int>();
  const auto epoch = stale[0][2].as<std::int64_t>();
  auto ended =
      tx.exec_params(kEvictSql, detail::node_application_name(holder, config_.connect.schema),
                     pid)[0][0]
          .as<std::int64_t>();
  spdlog::error(
      "EVICTING stale leader: node={} epoch={} backend_pid={}: its lease expired but it still "
      "holds the lock (frozen or cut off); terminated {} of its backends",
      holder, epoch, pid, ended);
  if (observer_ != nullptr) observer_->evicted_holder();
}

void Elector::end_deposed_transactions(pqxx::connection& conn, const std::string& previous) {
  Statement armed(*this, conn, Clock::now() + config_.lease,
                  "ending of the deposed leader's transactions");
  pqxx::nontransaction tx(conn);
  const auto ended = tx.exec_params(kEndDeposedSql,
                                    detail::node_application_name(previous, config_.connect.schema),
                                    previous)[0][0]
                         .as<std::int64_t>();
  if (ended > 0) {
    spdlog::warn(
        "ended {} open transaction(s) of the deposed leader {} so that its work can be "
        "rescued",
        ended, previous);
  }
}

void Elector::renew(pqxx::connection& conn, std::int64_t& held_epoch) {
  const auto sent = Clock::now();
  const auto sent_ns = detail::steady_now_ns();
  const auto in_statements = in_statements_ns_.load();
  const auto in_pauses = in_pauses_ns_.load();
  // A renewal that has not come back by the lease's end is of no use: cut it then.
  Statement armed(*this, conn, statement_deadline(held_epoch), "renewal");
  // Every renewal's time is observed, one that failed or was cut at the lease's end too.
  const auto took = [&] {
    if (observer_ != nullptr) {
      observer_->renewal_took(std::chrono::duration<double>(Clock::now() - sent).count());
    }
  };
  pqxx::result r;
  try {
    pqxx::nontransaction tx(conn);
    r = tx.exec_params(kRenewSql, config_.lock_key, config_.region, config_.node_id, held_epoch,
                       static_cast<std::int64_t>(config_.ttl.count()));
  } catch (...) {
    took();
    throw;
  }
  took();
  answered();
  if (r.affected_rows() == 0) {
    if (observer_ != nullptr) observer_->renewal_failed();
    const auto lost = held_epoch;
    held_epoch = 0;
    revoke(lost, RevokeReason::lost_renewal,
           "the renewal matched no lock row: another node holds it now");
    throw std::runtime_error(
        "renewal matched no lock row: another node took over (or this statement ran on another "
        "server session than the lock's: a transaction pooler)");
  }
  if (observer_ != nullptr) observer_->renewed();
  // Extend only if the watchdog did not revoke meanwhile; the lease runs from the SEND time.
  lease_from(sent_ns, in_statements, in_pauses);
  lease_.extend(held_epoch, sent + config_.lease);
}

void Elector::release(pqxx::connection& conn, std::int64_t epoch, RevokeReason reason,
                      bool shutdown) {
  Statement armed(*this, conn, Clock::now() + config_.lease, "release", shutdown);
  pqxx::nontransaction tx(conn);
  tx.exec_params(kReleaseRowSql, config_.lock_key, config_.region, config_.node_id, epoch,
                 std::string(to_string(reason)));
  tx.exec_params(kUnlockSql, config_.region, config_.lock_key);
  tx.exec_params("SELECT pg_notify($1, $2)", detail::leader_channel(config_.connect.schema),
                 detail::LeaderSignal{detail::LeaderSignal::released, config_.node_id}.encode());
}

void Elector::touch_node_row(pqxx::connection& conn, bool force) {
  if (!config_.writes_node_row) return;
  const auto now = Clock::now();
  if (!force && now - last_node_touch_ < std::chrono::seconds(1)) return;
  last_node_touch_ = now;
  const auto e = lease_.epoch();
  NodeRowState state{e != 0 ? "leader" : "follower", e,
                     e != 0 ? std::vector<int>{0} : std::vector<int>{}};
  if (config_.node_state) state = config_.node_state();
  std::string led = "{";
  for (std::size_t i = 0; i < state.shards_led.size(); ++i) {
    if (i > 0) led += ',';
    led += std::to_string(state.shards_led[i]);
  }
  led += '}';
  Statement armed(*this, conn, statement_deadline(e), "node row update");
  pqxx::nontransaction tx(conn);
  tx.exec_params(kNodeRowSql, config_.node_id, config_.host, static_cast<int>(getpid()),
                 config_.version, state.role, state.epoch, config_.metrics_addr,
                 config_.node_group.empty() ? group() : config_.node_group, handles_,
                 config_.shards, led);
}

#undef BATON_LOCK_KEY

}  // namespace baton::leader
