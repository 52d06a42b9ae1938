// The job table's state changes, each one statement and each fenced (docs/concepts.md, "Fencing"):
// a claim succeeds only while the lock row shows the claimer's epoch, and every outcome applies
// only to a row still running under the claim that produced it.
//
// Epochs are per lock row, so a job records the lock group (region/lock_key) whose leader
// claimed it, and every statement that compares epochs does so within that group. A job also
// counts its claims (never reset); that count is the claim's token, which every outcome matches.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <pqxx/pqxx>

#include "baton/job.h"

namespace baton::detail {

struct LockName {
  std::string lock_key;
  std::string region;
  // How jobs name the group whose leader claimed them: "<region>/<lock_key>" (both follow the
  // naming rule, which has no '/', so the text is unambiguous).
  std::string group() const { return region + "/" + lock_key; }
};

// The leader of `lock` at `epoch`, as it claims and settles jobs.
struct Claimer {
  LockName lock;
  std::string node_id;
  std::int64_t epoch = 0;
};

// A job's place in claim order within its shard: (priority, run_at, id).
struct ClaimKey {
  int priority = 0;
  std::int64_t run_at_us = 0;  // µs since 1970 (exact: timestamptz keeps microseconds)
  std::int64_t id = 0;
  // Claim order: priority, then run_at, then id.
  bool operator<(const ClaimKey& o) const {
    return std::tie(priority, run_at_us, id) < std::tie(o.priority, o.run_at_us, o.id);
  }
};

struct ClaimFilter {
  std::vector<std::string> queues;  // empty: every queue
  std::vector<std::string> except;  // never these queues
  std::vector<std::string> types;   // only jobs of these types (the node's handlers)
  // Skip rows another transaction holds (an operator's SELECT ... FOR UPDATE) instead of
  // waiting for them. Costs a row lock per job, so the poller uses it only after a claim waited.
  bool skip_locked = false;
  int shard = 0;  // the claimer's shard
  // When positive (shards, a queue with a concurrency limit: `queues` holds just that queue),
  // claims of the queue are serialised across the cluster and take at most this many less the
  // jobs of the queue running anywhere.
  int cluster_limit = 0;
  // Only jobs after this place in claim order (none: from the start). A claim from the start
  // steps over the index entries of every job claimed since the last vacuum; in a large drain
  // that is most of its time (docs/performance.md). Jobs before the place are not seen.
  std::optional<ClaimKey> after{};
};

struct ClaimedJob {
  Job job;
  std::int64_t token = 0;                           // the job's claim count: fences outcomes
  int timeout_ms = 0;                               // 0: none
  double wait_seconds = 0;                          // run_at to claim
  double since_enqueue_seconds = 0;                 // created_at to claim
  std::chrono::steady_clock::time_point claimed{};  // this node's clock, when the claim returned
  bool cancel_requested = false;
  std::int64_t claimed_at_us = 0;  // the claim's transaction time, database clock, µs since 1970
  ClaimKey key{};                  // its place in claim order
  bool partitioned = false;        // in an ordered partition: its end lets the next one run
  // Of a queue whose limit is kept across the cluster (shards): its end frees a place in it.
  bool cluster_limited = false;
};

// The claim's statement as claim_jobs prepares it: with FOR UPDATE SKIP LOCKED or without, and
// from the start of claim order or after a place in it. Its parameters are claim_jobs' (see
// there). For bench/claim_parts, which takes it apart.
std::string claim_statement(bool skip_locked, bool after);

// Claims up to `limit` available, due jobs that `filter` admits (and not of paused queues) for
// the claimer. `schema` names the deployment in the jobs' derived idempotency keys.
std::vector<ClaimedJob> claim_jobs(pqxx::connection& conn, const Claimer& claimer, int limit,
                                   const ClaimFilter& filter, const std::string& schema = "baton");

// The jobs of a claim that committed without its answer reaching the claimer (its session was
// cut as it committed): running under the claimer's epoch and node, claimed after `after_us`
// (the claimed_at_us of the claimer's last answered claim of the epoch) and before `before_us`
// (the database time at its reconnection). They are stamped claimed now; their claimed_at_us
// is that time. Only the claimer may ask, between its claims.
std::vector<ClaimedJob> unanswered_claim(pqxx::connection& conn, const Claimer& claimer,
                                         std::int64_t after_us, std::int64_t before_us,
                                         const std::string& schema);

// The server session behind a connection: its pid and start (which tell it from a later
// session with that pid), and the database time when asked (microseconds since 1970).
struct ServerSession {
  int pid = 0;
  std::int64_t started_us = 0;
  std::int64_t now_us = 0;
};
ServerSession server_session(pqxx::connection& conn);

// Whether the server session `cut` (another than conn's) is still in a transaction: a claim it
// was sending when it was cut may commit yet.
bool cut_session_busy(pqxx::connection& conn, const ServerSession& cut);

struct Rescued {
  std::size_t requeued = 0;
  std::size_t dead = 0;       // the lost run was the last attempt: dead with reason `crashed`
  std::size_t cancelled = 0;  // cancellation had been asked: in history as cancelled
};

// Running jobs that no live run will finish: those of this group claimed under an older epoch
// (but not `still_running`, jobs this node runs since an earlier epoch of its own), and those of
// another group that has had no valid lease for `leaderless_grace` (its nodes are gone). Each goes
// back to the queue with the crash in its errors, or to dead_jobs when the lost run was its last
// attempt. Rows locked by an unfinished commit are skipped (the next pass takes them).
Rescued rescue_lost(pqxx::connection& conn, const Claimer& claimer,
                    const std::vector<std::int64_t>& still_running,
                    std::chrono::milliseconds leaderless_grace);

// This group's running jobs with a timeout that produced no outcome within timeout + grace (a hung
// handler): retried, or dead when no attempt is left. Returns how many.
std::size_t rescue_timed_out(pqxx::connection& conn, const Claimer& claimer, std::int64_t grace_ms);

// Jobs running under this claimer that a producer or operator asked to cancel.
std::vector<std::int64_t> cancel_requested(pqxx::connection& conn, const Claimer& claimer);

// Moves waiting jobs whose shard is `shards` or more (the count shrank, or a producer enqueued
// while it changed) to their shard under `shards`. Returns how many (at most 10,000 a call).
std::size_t move_stray_jobs(pqxx::connection& conn, int shards);

// Summarizes again the history index's ranges that prune_history deleted rows from, those not
// summarized yet, and `ranges` more from block `from` (negative: at random; a sweep for summaries
// a long transaction kept wide). Returns the block the sweep goes on from next time, or nothing
// when another session held history (sql/0018).
std::optional<std::int64_t> summarize_history(pqxx::connection& conn, std::int64_t from,
                                              int ranges);

// One batch of each kind of row older than the retention: history, completed sagas, leadership
// events.
struct Pruned {
  std::size_t rows = 0;  // deleted, all kinds
  bool more = false;     // some kind had a full batch: there may be more
};
// Deletes up to `batch` rows of each kind finished longer than `retention_ms` ago.
Pruned prune_history(pqxx::connection& conn, std::int64_t retention_ms, int batch);

// Notifies the jobs channel of `schema` for each of `queues` (limited across the cluster, a place
// of which was just freed) on whose shards a leader may be asleep: one whose wake keys it cannot
// take shared, as a producer's enqueue decides (sql/0012_shards.sql, leader_busy). Sent when `tx`
// commits. Returns how many notifications.
long long wake_limited_queues(pqxx::transaction_base& tx, std::string_view schema,
                              const std::vector<std::string>& queues);

struct Completion {
  std::int64_t id;
  std::int64_t epoch;
  std::int64_t token;
  double run_seconds;
  std::string queue{};  // for the metrics of a fenced outcome
  std::string type{};
  // Its job's claim was held short by an ordered partition, or by a queue limit kept across the
  // cluster: once the outcome is written, another job may be claimed, here (the completer wakes
  // the pollers) or, for the limit, on another node (the completer notifies the jobs channel).
  bool partitioned = false;
  bool cluster_limited = false;
};
struct Failure {
  std::int64_t id;
  std::int64_t epoch;
  std::int64_t token;
  int attempt;  // for the error history
  std::string error;
  bool dead;           // true: move to dead_jobs now
  std::string reason;  // for dead: exhausted, bad_payload, discarded
  std::int64_t retry_delay_ms;
  std::string queue{};  // for the metrics of a fenced outcome
  std::string type{};
  bool partitioned = false;      // as for Completion
  bool cluster_limited = false;  // as for Completion
};

// A claimed job that never started (leadership ended, or the node is shutting down): back to
// available with its attempt given back, fenced like any outcome.
struct Release {
  std::int64_t id;
  std::int64_t epoch;
  std::int64_t token;
  bool partitioned = false;      // as for Completion
  std::string queue{};           // for cluster_limited
  bool cluster_limited = false;  // as for Completion
};

// Completes one job inside the caller's transaction (transactional handlers). False when the job
// is no longer running under that claim: the caller must roll back (fenced). When given, `xid`
// gets a reference to the transaction, for transaction_status should the answer to its COMMIT
// be lost.
bool complete_in(pqxx::work& tx, const Completion& done, std::string* xid = nullptr);

// What became of a transaction (a reference from complete_in or apply_outcomes): "committed",
// "aborted", "in progress" (its session has not ended it yet), or "unknown" (another server,
// such as a standby promoted since, or a restart; or too old for the server to tell).
std::string transaction_status(pqxx::connection& conn, const std::string& xid);

// Applies outcomes in one transaction. Returns how many completions and failures were applied;
// the ids of the rest (the fenced ones) go to `fenced` when given. Releases that no longer match
// (a newer epoch rescued the job) are ignored. A failure of a job whose cancellation was asked
// goes to history as cancelled instead of being retried. When the connection is lost during
// COMMIT, `in_doubt` (when given) gets a reference to the transaction before the error is
// rethrown: the outcomes may have been written (transaction_status tells). A statement that
// fails is rolled back; should the ROLLBACK fail too, pqxx::broken_connection is thrown (the
// connection must not be used again).
std::size_t apply_outcomes(pqxx::connection& conn, const std::vector<Completion>& done,
                           const std::vector<Failure>& failed,
                           std::vector<std::int64_t>* fenced = nullptr,
                           const std::vector<Release>& released = {},
                           std::size_t* released_applied = nullptr,
                           std::string* in_doubt = nullptr);

}  // namespace baton::detail
