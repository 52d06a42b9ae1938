// Balancer: each node's fair share of the shards (see balancer.h).
#include "leader/balancer.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "baton/detail/backoff.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/clock.h"
#include "baton/detail/text.h"

namespace baton::leader {
namespace {

using Clock = std::chrono::steady_clock;

// Kind 0: the deployment's shard count. Kind 1: the live nodes, oldest first. Kind 2: the shards
// whose lease ended over a second ago. Kind 3: the shards whose advisory lock a session holds (the
// key as the elector derives it). Kind 4: the shards with a valid lease. $1 the nodes' group, $2
// the schema (sessions are named
// "<node id>@<schema>"), $3 the region, $4 the shards' lock keys.
constexpr const char* kPassSql = R"sql(
SELECT 0, coalesce((SELECT value FROM settings WHERE key = 'shards'), '1'), NULL::timestamptz
UNION ALL
SELECT 1, n.node_id, n.started_at
  FROM nodes n
 WHERE n.lock_group = $1 AND n.role NOT IN ('stopped', 'stepping_down')
   AND n.last_seen > now() - interval '5 seconds'
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                WHERE a.application_name = n.node_id || '@' || $2
                  AND a.datname = current_database())
UNION ALL
SELECT 2, l.lock_key, NULL
  FROM locks l
 WHERE l.region = $3 AND l.lock_key = ANY ($4::text[])
   AND l.expires_at < clock_timestamp() - interval '1 second'
UNION ALL
SELECT 3, k.lock_key, NULL
  FROM unnest($4::text[]) AS k(lock_key),
       LATERAL (SELECT hashtextextended(current_schema() || '/' || $3 || '/' || k.lock_key, 0)
                  AS key) h
 WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_locks p
                WHERE p.locktype = 'advisory' AND p.granted AND p.objsubid = 1
                  AND p.database = (SELECT oid FROM pg_catalog.pg_database
                                     WHERE datname = current_database())
                  AND p.classid = ((h.key >> 32) & 4294967295)::oid
                  AND p.objid = (h.key & 4294967295)::oid)
UNION ALL
SELECT 4, l.lock_key, NULL
  FROM locks l
 WHERE l.region = $3 AND l.lock_key = ANY ($4::text[]) AND l.expires_at > clock_timestamp()
ORDER BY 1, 3, 2
)sql";

}  // namespace

Balancer::Balancer(BalancerConfig config, BalancerHooks hooks,
                   std::vector<const detail::Lease*> leases)
    : config_(std::move(config)),
      hooks_(std::move(hooks)),
      leases_(std::move(leases)),
      shards_(static_cast<int>(leases_.size())),
      // Until the first pass: a node alone leads everything; a node among others learns its
      // share within a pass (before any of its electors has won much).
      target_(0),
      keep_until_(leases_.size()) {}

Balancer::~Balancer() {
  stop();
}

void Balancer::start() {
  thread_ = std::thread([this] { loop(); });
}

void Balancer::stop() {
  stopping_.store(true);
  waker_.wake();
  detail::CallWatch::instance().abort(detail::owner_of(this));
  if (thread_.joinable()) thread_.join();
  detail::CallWatch::instance().end_abort(detail::owner_of(this));
  // A hand-over in progress ends within the grace (drain_shard's bound).
  if (hand_over_thread_.joinable()) hand_over_thread_.join();
}

int Balancer::led() const {
  int n = 0;
  for (const auto* lease : leases_) {
    if (lease->epoch() != 0) ++n;
  }
  return n;
}

void Balancer::stand_aside(Millis how_long) {
  // The longest of overlapping step-downs wins (a shutdown's stays, whatever comes after it).
  const auto until = detail::steady_now_ns() + std::chrono::nanoseconds(how_long).count();
  auto seen = aside_until_ns_.load();
  while (seen < until && !aside_until_ns_.compare_exchange_weak(seen, until)) {
  }
  target_.store(0);
  waker_.wake();
}

bool Balancer::aside() const {
  return detail::steady_now_ns() < aside_until_ns_.load();
}

bool Balancer::may_stand(int shard) {
  if (count_mismatch_.load() || aside()) return false;
  if ((orphaned_.load() >> shard) & 1U) return true;
  // A shard some session holds is not worth an attempt (as of the last pass), nor one this node
  // just lost.
  if (((held_.load() | lost_.load()) >> shard) & 1U) return false;
  if (led() >= target_.load()) return false;
  // One attempt at a time: a grant takes a round trip or two (more with a synchronous standby);
  // until it is counted, another elector of this node waits. The time limit only covers an
  // attempt that never reported (its elector's connection failed mid-way).
  const auto now = detail::steady_now_ns();
  std::lock_guard lock(standing_mutex_);
  if (standing_ >= 0 && now < stand_until_ns_) return false;
  standing_ = shard;
  stand_until_ns_ = now + 2'000'000'000;
  return true;
}

void Balancer::stood(int shard, bool won) {
  if (!won) lost_.fetch_or(std::uint64_t{1} << shard);
  {
    std::lock_guard lock(standing_mutex_);
    if (standing_ != shard) return;
    standing_ = -1;
  }
  // Still under the share: the next free shard's elector tries now.
  if (!aside() && led() < target_.load() && hooks_.nudge) hooks_.nudge();
}

void Balancer::loop() {
  std::unique_ptr<pqxx::connection> conn;
  detail::Backoff backoff(Millis(100), Millis(2000));
  bool reported = false;
  auto options = config_.connect;
  options.statement_timeout_ms = 2000;
  while (!stopping_.load()) {
    try {
      if (!conn) conn = detail::connect(options, detail::owner_of(this));
      pass(*conn);
      if (reported) spdlog::info("balancer: database reachable again");
      reported = false;
      backoff.reset();
      waker_.wait(-1, config_.interval);
    } catch (const std::exception& e) {
      conn.reset();
      if (stopping_.load()) break;
      if (!reported) {
        spdlog::warn("balancer: {}; retrying with backoff", detail::failure_text(e));
        reported = true;
      }
      waker_.wait(-1, backoff.next_jittered());
    }
  }
}

void Balancer::pass(pqxx::connection& conn) {
  std::vector<std::string> live;
  std::uint64_t orphaned = 0;
  std::uint64_t held = 0;
  std::uint64_t leased = 0;
  int deployment_shards = shards_;
  {
    auto armed = detail::CallWatch::instance().arm(conn, Millis(2000), detail::owner_of(this));
    pqxx::nontransaction tx(conn);
    const auto rows = tx.exec_params(kPassSql, config_.node_group, config_.connect.schema,
                                     config_.region, detail::text_array(config_.lock_keys));
    for (const auto& r : rows) {
      const int kind = r[0].as<int>();
      if (kind == 0) {
        deployment_shards = r[1].as<int>(shards_);
      } else if (kind == 1) {
        live.emplace_back(r[1].c_str());
      } else {
        const auto it = std::find(config_.lock_keys.begin(), config_.lock_keys.end(), r[1].c_str());
        if (it != config_.lock_keys.end()) {
          auto& bits = kind == 2 ? orphaned : kind == 3 ? held : leased;
          bits |= std::uint64_t{1} << (it - config_.lock_keys.begin());
        }
      }
    }
  }
  const bool mismatch = deployment_shards != shards_;
  if (mismatch != count_mismatch_.exchange(mismatch)) {
    if (mismatch) {
      spdlog::error(
          "the deployment now has {} shards (settings.shards) and this node runs {}: it leads "
          "none until restarted with --shards {}",
          deployment_shards, shards_, deployment_shards);
    } else {
      spdlog::info("the deployment's shard count is {} again, as this node's", shards_);
    }
  }
  orphaned_.store(mismatch ? 0 : orphaned);
  leased_.store(leased);
  lost_.store(0);
  const auto freed = held_.exchange(held) & ~held;
  auto self = std::find(live.begin(), live.end(), config_.node_id);
  if (aside()) {
    target_.store(0);
    return;
  }
  if (self == live.end()) {
    live.push_back(config_.node_id);  // its row is on its way
    self = live.end() - 1;
  }
  const int nodes = static_cast<int>(live.size());
  const int rank = static_cast<int>(self - live.begin());
  const int target = mismatch ? 0 : shards_ / nodes + (rank < shards_ % nodes ? 1 : 0);
  const int before = target_.exchange(target);
  if (target != before) {
    spdlog::info("fair share: {} of {} shards ({} live nodes), leading {}", target, shards_, nodes,
                 led());
  }
  // A node died or left (its shards are free, or are about to be): try at once, not at the
  // electors' next retry.
  if ((freed != 0 || target > before || nodes < last_live_) && led() < target && hooks_.nudge) {
    hooks_.nudge();
  }
  last_live_ = nodes;
  // Over the share: hand one shard over, one at a time and at most every hand_over_every,
  // highest-numbered first, skipping shards that were just kept.
  // Read once: a hand-over thread that ends between two reads would otherwise still be joinable
  // when the next one is assigned.
  const bool busy = handing_over_.load() >= 0;
  if (!busy && hand_over_thread_.joinable()) hand_over_thread_.join();
  if (const int kept = kept_shard_.exchange(-1); kept >= 0) {
    keep_until_[static_cast<std::size_t>(kept)] = Clock::now() + config_.hand_over_retry;
  }
  if (led() > target && !busy && Clock::now() >= next_hand_over_) {
    next_hand_over_ = Clock::now() + config_.hand_over_every;
    for (int k = shards_ - 1; k >= 0; --k) {
      const auto i = static_cast<std::size_t>(k);
      if (leases_[i]->epoch() == 0 || Clock::now() < keep_until_[i]) continue;
      spdlog::info("handing shard {} over: leading {}, fair share {}", k, led(), target);
      handing_over_.store(k);
      // On a thread of its own: the drain may take up to the grace, and the passes go on.
      hand_over_thread_ = std::thread([this, k] {
        if (!hooks_.hand_over(k)) kept_shard_.store(k);
        handing_over_.store(-1);
        waker_.wake();
      });
      break;
    }
  }
}

}  // namespace baton::leader
