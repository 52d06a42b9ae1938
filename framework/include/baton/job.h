// What a handler sees of a job, and the options a producer sets when enqueueing one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace baton {

// A claimed job as the handler sees it. Immutable once the handler starts.
struct Job {
  std::int64_t id = 0;
  std::string queue;
  std::string type;
  std::string payload;  // JSON text, as enqueued
  int attempt = 0;      // 1 on the first run
  int max_attempts = 0;
  std::int64_t epoch = 0;  // the leader's fencing epoch under which it was claimed
  std::chrono::system_clock::time_point enqueued_at{};  // when it was enqueued (database clock)
  // The same for every attempt on every node and epoch: the producer's idempotency key when it
  // gave one, else "baton:<schema>:<job id>".
  std::string idempotency_key;
};

// Options of an enqueue. Defaults: queue "default", priority 0 (lower runs first), now, 10 tries.
struct EnqueueOptions {
  std::string queue = "default";
  int priority = 0;  // -32768..32767; lower runs first
  std::chrono::milliseconds delay{0};
  // When set, the job runs at this time instead of now + delay.
  std::optional<std::chrono::system_clock::time_point> run_at{};
  int max_attempts = 10;  // 1..1000
  // In an ordered queue, jobs with the same key run one at a time, in enqueue order.
  std::string partition_key{};
  // While a job with this key is live in the queue, enqueueing another returns its id instead.
  std::string idempotency_key{};
  // A run longer than this fails with "timeout"; 0 means none.
  std::chrono::milliseconds timeout{0};
};

// What a cancel did (baton.cancel, Client::cancel, Admin::cancel).
enum class CancelResult {
  cancelled,   // it had not started: it is in job_history as cancelled now
  cancelling,  // it is running: its handler sees cancelled(); it ends as cancelled (or completed)
  finished,    // it had finished already (completed, cancelled or dead): nothing changed
  not_found,   // no such job
};
std::string_view to_string(CancelResult result);

// Where a job is now (Client::status). `status` is one of: available, scheduled, running,
// cancelling (live); completed, cancelled (in job_history); dead (in dead_jobs).
struct JobStatus {
  std::int64_t id = 0;
  std::string queue;
  std::string type;
  std::string status;
  int attempts = 0;
  int max_attempts = 0;  // 0 for finished jobs (history does not keep it)
  std::optional<std::chrono::system_clock::time_point> run_at;
  std::chrono::system_clock::time_point created_at{};
  std::optional<std::chrono::system_clock::time_point> finished_at;
  std::string last_error;  // empty when none
};

// One job of a batch.
struct NewJob {
  std::string type;
  nlohmann::json payload;
  EnqueueOptions options;
};

// Handed to a handler for one run of one job. Not shared: one context per run.
class JobContext {
 public:
  // `cancelled` is the only source of cancellation: for tests of a handler.
  JobContext(Job job, std::chrono::steady_clock::time_point deadline,
             const std::atomic<bool>& cancelled)
      : JobContext(std::move(job), deadline, cancelled, cancelled) {}
  // `leadership_ended`: the epoch of this run ended or the node is stopping (the job will run
  // again elsewhere). `cancel_asked`: a producer or operator cancelled the job (it will not).
  // `started_at`: see started_at() (a node passes the instant it read before its lease check).
  JobContext(Job job, std::chrono::steady_clock::time_point deadline,
             const std::atomic<bool>& leadership_ended, const std::atomic<bool>& cancel_asked,
             std::chrono::system_clock::time_point started_at = std::chrono::system_clock::now())
      : job_(std::move(job)),
        deadline_(deadline),
        started_at_(started_at),
        leadership_ended_(leadership_ended),
        cancel_asked_(cancel_asked) {}

  const Job& job() const { return job_; }
  nlohmann::json payload() const { return nlohmann::json::parse(job_.payload); }
  // Past the deadline the run counts as failed; long handlers should check it.
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  // When the node let this run start, by the system clock: read just before it checked that its
  // lease was still valid. A run is never let start after its lease ended, so started_at() is
  // before that end even when the node was paused (SIGSTOP, a suspended VM) on its way into the
  // handler. For logs, and for a receiver that checks when a write was decided.
  std::chrono::system_clock::time_point started_at() const { return started_at_; }
  // True once this run should stop early: the node lost leadership or is shutting down (the job
  // runs again), or the job was cancelled (it does not). Check it in long loops.
  bool cancelled() const {
    return leadership_ended_.load(std::memory_order_relaxed) ||
           cancel_asked_.load(std::memory_order_relaxed);
  }
  // True when the job itself was cancelled (baton.cancel, Client::cancel, batonctl jobs cancel).
  bool cancel_requested() const { return cancel_asked_.load(std::memory_order_relaxed); }
  // Pass it downstream so that effects outside PostgreSQL happen once: it is the same for every
  // attempt of this job on every node and epoch (see Job::idempotency_key).
  const std::string& idempotency_key() const { return job_.idempotency_key; }
  // The epoch this run was claimed under: it only grows. A receiver that remembers the highest
  // token it saw per job (or resource) can refuse a write from a deposed leader's late run.
  std::int64_t fencing_token() const { return job_.epoch; }

 private:
  Job job_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::system_clock::time_point started_at_;
  const std::atomic<bool>& leadership_ended_;
  const std::atomic<bool>& cancel_asked_;
};

}  // namespace baton
