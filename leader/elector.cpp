// Election by lock row + advisory lock + heartbeat (see elector.h for the strategy).
#include "leader/elector.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <random>

#include <spdlog/spdlog.h>

namespace baton::leader {
namespace {

using Clock = std::chrono::steady_clock;

// The advisory key is derived on the server from the schema (advisory locks are database-wide,
// and two deployments may share a database in different schemas), region and lock_key.
#define BATON_LOCK_KEY(region, lock_key) \
  "hashtextextended(current_schema() || '/' || " region " || '/' || " lock_key ", 0)"
constexpr const char* kTryLockSql = "SELECT pg_try_advisory_lock(" BATON_LOCK_KEY("$1", "$2") ")";

// Returns the new epoch and the previous holder (NULL on the very first grant).
constexpr const char* kGrantSql = R"sql(
WITH previous AS (SELECT client_id, renewed_at FROM locks WHERE lock_key = $1 AND region = $2)
INSERT INTO locks AS l (lock_key, region, client_id, created_date, epoch, renewed_at, expires_at,
                        holder_pid, holder_host)
VALUES ($1, $2, $3, now(), 1, clock_timestamp(),
        clock_timestamp() + $4::bigint * interval '1 millisecond', pg_backend_pid(), $5)
ON CONFLICT (lock_key, region) DO UPDATE
   SET client_id = excluded.client_id, created_date = excluded.created_date,
       epoch = l.epoch + 1, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
       holder_pid = excluded.holder_pid, holder_host = excluded.holder_host
RETURNING epoch, (SELECT client_id FROM previous),
          (SELECT extract(epoch FROM clock_timestamp() - renewed_at)::float8 FROM previous)
)sql";

// A deposed leader that froze may have transactions open (a transactional handler between its
// writes and its commit). Ending them releases their row locks so that the rescue can proceed;
// their commits would be fenced anyway.
constexpr const char* kEndDeposedSql = R"sql(
SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(pid))
  FROM pg_catalog.pg_stat_activity
 WHERE application_name = $1 AND datname = current_database()
   AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()
)sql";

constexpr const char* kRenewSql = R"sql(
UPDATE locks SET renewed_at = clock_timestamp(),
                 expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond'
 WHERE lock_key = $1 AND region = $2 AND client_id = $3 AND epoch = $4
)sql";

constexpr const char* kReleaseRowSql = R"sql(
UPDATE locks SET expires_at = clock_timestamp()
 WHERE lock_key = $1 AND region = $2 AND client_id = $3 AND epoch = $4
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

constexpr const char* kNodeRowSql = R"sql(
INSERT INTO nodes AS n (node_id, host, pid, version, role, epoch, metrics_addr)
VALUES ($1, $2, $3, $4, $5, nullif($6, 0), nullif($7, ''))
ON CONFLICT (node_id) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, version = excluded.version,
       last_seen = now(), role = excluded.role, epoch = coalesce(excluded.epoch, n.epoch),
       metrics_addr = excluded.metrics_addr,
       started_at = CASE WHEN n.pid = excluded.pid THEN n.started_at ELSE now() END
)sql";

// LISTENs on the leader channel; notifications only need to wake the poll(), not be read.
// LISTENs on the leader channel and keeps the payloads ("released <node>", "yield <node>").
struct WakeReceiver : pqxx::notification_receiver {
  WakeReceiver(pqxx::connection_base& conn, const std::string& channel,
               std::vector<std::string>& out)
      : pqxx::notification_receiver(conn, channel), out_(out) {}
  void operator()(const std::string& payload, int) override { out_.push_back(payload); }
  std::vector<std::string>& out_;
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

Elector::Elector(ElectorConfig config, LeadershipCallbacks callbacks,
                 detail::LeaderObserver* observer, std::function<void()> on_yield_request)
    : config_(std::move(config)),
      callbacks_(std::move(callbacks)),
      on_yield_request_(std::move(on_yield_request)),
      observer_(observer) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

Elector::~Elector() {
  stop();
  close(wake_fd_);
}

void Elector::start() {
  events_thread_ = std::thread([this] { event_loop(); });
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

void Elector::stop() {
  if (stopping_.exchange(true)) return;
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
  if (heartbeat_.joinable()) heartbeat_.join();
  {
    std::lock_guard lock(mutex_);
    events_done_ = true;
  }
  cv_.notify_all();
  if (events_thread_.joinable()) events_thread_.join();
}

void Elector::yield() {
  yield_requested_.store(true);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
}

void Elector::request_yield() {
  const auto e = epoch_.load();
  if (e != 0) post({Event::yield_request, e, RevokeReason::stepped_down});
}

bool Elector::leading(std::int64_t epoch) const {
  return epoch != 0 && epoch_.load() == epoch && now_ns() < lease_deadline_ns_.load();
}

bool Elector::is_leader() const {
  const auto e = epoch_.load();
  return leading(e);
}

std::int64_t Elector::epoch() const {
  return epoch_.load();
}

bool Elector::revoke(std::int64_t epoch, RevokeReason reason) {
  std::int64_t expected = epoch;
  if (epoch == 0 || !epoch_.compare_exchange_strong(expected, 0)) return false;
  lease_deadline_ns_.store(0);
  if (reason == RevokeReason::shutting_down || reason == RevokeReason::stepped_down) {
    spdlog::info("leadership released: epoch={} reason={}", epoch, to_string(reason));
  } else {
    spdlog::warn("leadership LOST: epoch={} reason={}", epoch, to_string(reason));
  }
  if (observer_ != nullptr) observer_->revoked(epoch, to_string(reason));
  post({Event::revoked, epoch, reason});
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
    // Wakes at least every renew interval to enforce the lease on the steady clock, even when
    // the heartbeat thread is stuck in a statement.
    cv_.wait_for(lock, config_.renew_interval, [this] { return !events_.empty() || events_done_; });
    const auto e = epoch_.load();
    if (e != 0 && now_ns() >= lease_deadline_ns_.load()) {
      lock.unlock();
      if (observer_ != nullptr) observer_->renewal_failed();
      revoke(e, RevokeReason::lost_renewal);
      lock.lock();
    }
    while (!events_.empty()) {
      Event ev = events_.front();
      events_.pop_front();
      lock.unlock();
      try {
        if (ev.kind == Event::granted && callbacks_.on_granted) callbacks_.on_granted(ev.epoch);
        if (ev.kind == Event::revoked && callbacks_.on_revoked) {
          callbacks_.on_revoked(ev.epoch, ev.reason);
        }
        if (ev.kind == Event::yield_request) {
          if (on_yield_request_) {
            on_yield_request_();
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
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {sock, POLLIN, 0}};
  poll(fds, sock >= 0 ? 2 : 1, static_cast<int>(timeout.count()));
}

void Elector::heartbeat_loop() {
  std::unique_ptr<pqxx::connection> conn;
  std::unique_ptr<WakeReceiver> receiver;  // declared after conn: destroyed before it
  std::int64_t held_epoch = 0;             // the epoch this thread holds the advisory lock for
  std::mt19937_64 rng(std::random_device{}());
  Millis backoff{100};
  bool reported_down = false;

  while (!stopping_.load()) {
    try {
      if (!conn) {
        conn = detail::connect(config_.connect);
        // Followers wake at once when a leader releases its lock.
        receiver = std::make_unique<WakeReceiver>(
            *conn, detail::leader_channel(config_.connect.schema), notifications_);
        connected_.store(true);
        if (reported_down) spdlog::info("election connection restored");
        reported_down = false;
        backoff = Millis(100);
        touch_node_row(*conn, true);
      }
      step(*conn, held_epoch);
    } catch (const std::exception& e) {
      if (held_epoch != 0) {
        revoke(held_epoch, RevokeReason::connection_lost);
        held_epoch = 0;
      }
      receiver.reset();
      conn.reset();  // closing the session frees the advisory lock
      connected_.store(false);
      if (observer_ != nullptr) observer_->database_error("elector");
      if (!reported_down) {
        spdlog::error("election connection failed: {}; reconnecting with backoff",
                      detail::scrub(e.what()));
        reported_down = true;
      }
      std::uniform_int_distribution<std::int64_t> jitter(backoff.count() / 2, backoff.count());
      wait(-1, Millis(jitter(rng)));
      backoff = std::min(backoff * 2, Millis(5000));
    }
  }

  // Shutting down: release leadership so that a follower takes over within milliseconds.
  if (held_epoch != 0) {
    revoke(held_epoch, RevokeReason::shutting_down);
    if (conn) {
      try {
        release(*conn, held_epoch);
      } catch (const std::exception& e) {
        spdlog::warn("could not release leadership cleanly ({}); closing the session frees it",
                     detail::scrub(e.what()));
      }
    }
  }
  if (conn) {
    try {
      receiver.reset();
      pqxx::nontransaction tx(*conn);
      tx.exec_params("UPDATE nodes SET role = 'stopped', last_seen = now() WHERE node_id = $1",
                     config_.node_id);
    } catch (const std::exception&) {
      // The row ages out by last_seen anyway.
    }
  }
}

void Elector::step(pqxx::connection& conn, std::int64_t& held_epoch) {
  if (held_epoch != 0 && epoch_.load() != held_epoch) {
    // The watchdog revoked the lease while this thread was busy: give the lock up for real.
    throw std::runtime_error("lease ran out before renewal succeeded");
  }
  if (held_epoch != 0 && yield_requested_.exchange(false)) {
    const auto epoch = held_epoch;
    held_epoch = 0;
    revoke(epoch, RevokeReason::stepped_down);
    release(conn, epoch);
    // Stay out long enough for a follower to win, or the same node would simply win again.
    hold_off_until_ = Clock::now() + 2 * config_.renew_interval + 2 * config_.retry_interval;
    touch_node_row(conn, true);
    return;
  }
  if (held_epoch == 0) {
    yield_requested_.store(false);
    const bool held_off = Clock::now() < hold_off_until_;
    if (held_off || !try_acquire(conn, held_epoch)) {
      if (!held_off) maybe_evict(conn);
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

void Elector::handle_notifications(pqxx::connection& conn, std::int64_t held_epoch) {
  notifications_.clear();
  conn.get_notifs();  // throws when the server closed the session
  bool released = false;
  for (const auto& payload : notifications_) {
    if (held_epoch != 0 && (payload == "yield *" || payload == "yield " + config_.node_id)) {
      spdlog::info("asked to step down ({})", payload);
      post({Event::yield_request, held_epoch, RevokeReason::stepped_down});
    }
    released = released || payload.rfind("released ", 0) == 0;
  }
  if (released && held_epoch == 0) {
    // Every follower wakes on the same NOTIFY: a small random spread avoids a stampede.
    static thread_local std::mt19937_64 rng(std::random_device{}());
    wait(-1, Millis(std::uniform_int_distribution<int>(0, 10)(rng)));
  }
}

bool Elector::try_acquire(pqxx::connection& conn, std::int64_t& held_epoch) {
  {
    pqxx::nontransaction tx(conn);
    if (!tx.exec_params(kTryLockSql, config_.region, config_.lock_key)[0][0].as<bool>()) {
      return false;
    }
  }
  const auto sent = now_ns();
  // If this fails, the caller drops the session, so the advisory lock is never held without
  // the row.
  pqxx::work tx(conn);
  const auto row = tx.exec_params(kGrantSql, config_.lock_key, config_.region, config_.node_id,
                                  static_cast<std::int64_t>(config_.ttl.count()), config_.host)[0];
  const auto epoch = row[0].as<std::int64_t>();
  const std::string previous = row[1].is_null() ? "" : row[1].c_str();
  tx.commit();
  held_epoch = epoch;
  lease_deadline_ns_.store(sent + std::chrono::nanoseconds(config_.ttl).count());
  epoch_.store(epoch);
  spdlog::info("leadership GRANTED: epoch={}", epoch);
  if (observer_ != nullptr) {
    const bool takeover = !previous.empty() && previous != config_.node_id && !row[2].is_null();
    observer_->granted(epoch, takeover ? row[2].as<double>() : -1.0);
  }
  post({Event::granted, epoch, RevokeReason::stepped_down});
  touch_node_row(conn, true);
  if (!previous.empty() && previous != config_.node_id) end_deposed_transactions(conn, previous);
  return true;
}

void Elector::maybe_evict(pqxx::connection& conn) {
  pqxx::nontransaction tx(conn);
  auto stale = tx.exec_params(kStaleHolderSql, config_.lock_key, config_.region);
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
  pqxx::nontransaction tx(conn);
  const auto ended = tx.exec_params(kEndDeposedSql, detail::node_application_name(
                                                        previous, config_.connect.schema))[0][0]
                         .as<std::int64_t>();
  if (ended > 0) {
    spdlog::warn(
        "ended {} open transaction(s) of the deposed leader {} so that its work can be "
        "rescued",
        ended, previous);
  }
}

void Elector::renew(pqxx::connection& conn, std::int64_t& held_epoch) {
  const auto sent = now_ns();
  pqxx::nontransaction tx(conn);
  auto r = tx.exec_params(kRenewSql, config_.lock_key, config_.region, config_.node_id, held_epoch,
                          static_cast<std::int64_t>(config_.ttl.count()));
  if (r.affected_rows() == 0) {
    if (observer_ != nullptr) observer_->renewal_failed();
    const auto lost = held_epoch;
    held_epoch = 0;
    revoke(lost, RevokeReason::lost_renewal);
    throw std::runtime_error("renewal matched no lock row: another node took over");
  }
  if (observer_ != nullptr) observer_->renewed();
  // Extend only if the watchdog did not revoke meanwhile; the lease runs from the SEND time.
  if (epoch_.load() == held_epoch) {
    lease_deadline_ns_.store(sent + std::chrono::nanoseconds(config_.ttl).count());
  }
}

void Elector::release(pqxx::connection& conn, std::int64_t epoch) {
  pqxx::nontransaction tx(conn);
  tx.exec_params(kReleaseRowSql, config_.lock_key, config_.region, config_.node_id, epoch);
  tx.exec_params(kUnlockSql, config_.region, config_.lock_key);
  tx.exec_params("SELECT pg_notify($1, $2)", detail::leader_channel(config_.connect.schema),
                 "released " + config_.node_id);
}

void Elector::touch_node_row(pqxx::connection& conn, bool force) {
  const auto now = Clock::now();
  if (!force && now - last_node_touch_ < std::chrono::seconds(1)) return;
  last_node_touch_ = now;
  const auto e = epoch_.load();
  pqxx::nontransaction tx(conn);
  tx.exec_params(kNodeRowSql, config_.node_id, config_.host, static_cast<int>(getpid()),
                 config_.version, e != 0 ? "leader" : "follower", e, config_.metrics_addr);
}

#undef BATON_LOCK_KEY

}  // namespace baton::leader
