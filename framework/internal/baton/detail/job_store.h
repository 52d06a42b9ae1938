// The job table's state changes, each one statement and each fenced by the leader's epoch
// (DESIGN.md section 4): a claim succeeds only while the lock row shows the claimer's epoch, and
// every outcome applies only to a row still running under the epoch that claimed it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "baton/job.h"

namespace baton::detail {

struct ClaimedJob {
  Job job;
  int timeout_ms = 0;                               // 0: none
  double wait_seconds = 0;                          // run_at to claim
  double since_enqueue_seconds = 0;                 // created_at to claim
  std::chrono::steady_clock::time_point claimed{};  // this node's clock, when the claim returned
  std::string row_at;  // the row's address (ctid) after the claim, for its completion
};

struct LockName {
  std::string lock_key;
  std::string region;
};

// Claims up to `limit` available, due jobs of `queues` (all when empty) but not of `except`,
// nor of paused queues, for (node, epoch).
std::vector<ClaimedJob> claim_jobs(pqxx::connection& conn, const LockName& lock,
                                   const std::string& node_id, std::int64_t epoch, int limit,
                                   const std::vector<std::string>& queues,
                                   const std::vector<std::string>& except = {});

// Moves running jobs of epochs older than `epoch` back to available. Returns how many. Rows
// locked by a deposed leader's unfinished commit are skipped (the next pass takes them).
std::size_t rescue_older_epochs(pqxx::connection& conn, std::int64_t epoch);

// Running jobs with a timeout that produced no outcome within timeout + grace: retried, or dead
// when no attempt is left. Returns how many.
std::size_t rescue_timed_out(pqxx::connection& conn, std::int64_t grace_ms);

// Deletes up to `batch` history rows finished longer than `retention_ms` ago. Returns how many.
std::size_t prune_history(pqxx::connection& conn, std::int64_t retention_ms, int batch);

// Outcomes are fenced on (epoch, attempt): a late outcome of an attempt that was rescued and
// claimed again, even by the same leader, matches no row.
struct Completion {
  std::int64_t id;
  std::int64_t epoch;
  double run_seconds;
  int attempt;
  std::string queue{};  // for the metrics of a fenced outcome
  std::string type{};
  std::string row_at{};  // from the claim: lets the completion skip an index lookup; may be empty
};
struct Failure {
  std::int64_t id;
  std::int64_t epoch;
  int attempt;
  std::string error;
  bool dead;           // true: move to dead_jobs now
  std::string reason;  // for dead: exhausted, unknown_type, bad_payload, discarded
  std::int64_t retry_delay_ms;
  std::string queue{};  // for the metrics of a fenced outcome
  std::string type{};
};

// A claimed job that never started (leadership ended, or the node is shutting down): back to
// available with its attempt given back, fenced like any outcome.
struct Release {
  std::int64_t id;
  std::int64_t epoch;
  int attempt;
};

// Completes one job inside the caller's transaction (transactional handlers). False when the job
// is no longer running under `epoch`: the caller must roll back (fenced).
bool complete_in(pqxx::work& tx, const Completion& done);

// Applies outcomes in one transaction. Returns how many completions and failures were applied;
// the ids of the rest (the fenced ones) go to `fenced` when given. Releases that no longer match
// (a newer epoch rescued the job) are ignored.
std::size_t apply_outcomes(pqxx::connection& conn, const std::vector<Completion>& done,
                           const std::vector<Failure>& failed,
                           std::vector<std::int64_t>* fenced = nullptr,
                           const std::vector<Release>& released = {},
                           std::size_t* released_applied = nullptr);

}  // namespace baton::detail
