// What a handler sees of a job, and the options a producer sets when enqueueing one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

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

// One job of a batch.
struct NewJob {
  std::string type;
  nlohmann::json payload;
  EnqueueOptions options;
};

// Handed to a handler for one run of one job. Not shared: one context per run.
class JobContext {
 public:
  JobContext(Job job, std::chrono::steady_clock::time_point deadline,
             const std::atomic<bool>& cancelled)
      : job_(std::move(job)), deadline_(deadline), cancelled_(cancelled) {}

  const Job& job() const { return job_; }
  nlohmann::json payload() const { return nlohmann::json::parse(job_.payload); }
  // Past the deadline the run counts as failed; long handlers should check it.
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  // True once the node lost leadership or is shutting down: stop early, the job runs again.
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // "<job id>:<epoch>": pass it downstream so that effects outside PostgreSQL dedupe.
  std::string idempotency_key() const {
    return std::to_string(job_.id) + ":" + std::to_string(job_.epoch);
  }

 private:
  Job job_;
  std::chrono::steady_clock::time_point deadline_;
  const std::atomic<bool>& cancelled_;
};

}  // namespace baton
