// Interfaces through which the worker and the elector report what happens, so that metrics/ can
// count it without either of them knowing about Prometheus. Implementations must be thread-safe:
// they are called from the pool, the poller, the completer, the services and the elector at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace baton::detail {

enum class Outcome { completed, retried, dead };

// Why a claim ended without an answer while its node led: it waited out the lock timeout on a
// row another transaction holds, or it was still running when the lease ended, or when the
// session's statement timeout ran out.
enum class ClaimCut { row_locked, lease_end, statement_timeout };

class ErrorObserver {
 public:
  virtual ~ErrorObserver() = default;
  // A database error in one of the node's loops (`component`: elector, poller, completer, ...).
  virtual void database_error(std::string_view component) = 0;
  // The database refused the node's credentials (a wrong password, no pg_hba entry).
  virtual void authentication_failed() {}
};

class JobObserver : public virtual ErrorObserver {
 public:
  virtual void job_started(std::string_view queue, std::string_view type, double wait_seconds) = 0;
  // `total_seconds`: from enqueue to the end of this run.
  virtual void job_finished(std::string_view queue, std::string_view type, Outcome outcome,
                            double run_seconds, double total_seconds) = 0;
  // Outcomes the database refused because the job was no longer this epoch's.
  virtual void jobs_fenced(std::string_view queue, std::string_view type, std::size_t count) = 0;
  // Claimed jobs that never started (their epoch ended first) put back in the queue.
  virtual void jobs_released(std::size_t count) = 0;
  virtual void pool_busy(int busy, int threads, int concurrency) = 0;
  // Jobs handed to the pool that no thread has started yet.
  virtual void claimed_waiting(int count) = 0;
  // Outcomes waiting to be written by the completer.
  virtual void completer_pending(std::size_t count) = 0;
  // A claim came back (with jobs, or with none) after `seconds`; a failed one is not reported.
  virtual void claim_took(double seconds, bool found_jobs) = 0;
  // A claim ended without an answer (see ClaimCut); its jobs stay in the queue.
  virtual void claim_cut(ClaimCut reason) = 0;
  // The poller waited `seconds` (about --claim-gather, less when ended early) before its next
  // claim, so that the claim takes what a stream of jobs brought meanwhile.
  virtual void claim_gathered(double seconds) { static_cast<void>(seconds); }
};

struct QueueDepth {
  std::string queue;
  std::int64_t available = 0;  // due now
  std::int64_t scheduled = 0;  // run_at in the future
  std::int64_t running = 0;
  double oldest_available_seconds = 0;
  std::int64_t dead = 0;  // rows in dead_jobs
};

// Due jobs of a type the leader has no handler for: they wait for a leader that has one.
struct UnhandledJobs {
  std::string queue;
  std::string type;
  std::int64_t count = 0;
  double oldest_seconds = 0;
};

class QueueObserver {
 public:
  virtual ~QueueObserver() = default;
  // The whole picture, every sample: queues missing from it have no live jobs.
  virtual void queue_depths(const std::vector<QueueDepth>& depths) = 0;
  // Every sample, the whole list (empty when every due job has a handler here).
  virtual void unhandled_jobs(const std::vector<UnhandledJobs>& jobs) = 0;
  // This node stopped sampling (it no longer leads): its depth figures are stale.
  virtual void queue_depths_cleared() = 0;
};

class ScheduleObserver {
 public:
  virtual ~ScheduleObserver() = default;
  // A periodic tick was enqueued `lag_seconds` after its scheduled time.
  virtual void tick_enqueued(std::string_view schedule, double lag_seconds) = 0;
};

class LeaderObserver : public virtual ErrorObserver {
 public:
  // `failover_seconds`: from the previous holder's last renewal to this grant (database clock);
  // negative when there was no previous holder or it was this node.
  virtual void granted(std::int64_t epoch, double failover_seconds) = 0;
  virtual void revoked(std::int64_t epoch, std::string_view reason) = 0;
  virtual void renewed() = 0;
  // A renewal ended after `seconds`: answered, failed, or cut at the lease's end.
  virtual void renewal_took(double seconds) = 0;
  virtual void renewal_failed() = 0;
  virtual void evicted_holder() = 0;
  // A session that is not a node holds the leader lock while no node leads (true), or no longer.
  virtual void stranger_holds_lock(bool holds) = 0;
};

}  // namespace baton::detail
