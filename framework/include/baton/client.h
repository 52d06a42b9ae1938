// Client enqueues jobs from any process. One Client holds one connection: it is NOT safe to share
// between threads; give each thread its own. enqueue_in() enqueues inside a transaction of yours.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <pqxx/transaction_base>

#include "baton/job.h"

namespace baton {

// Thrown for a bad queue or type name, option or payload. The message says what to fix.
class EnqueueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct ClientOptions {
  std::string schema = "baton";
  std::size_t max_payload_bytes = 1 << 20;  // a larger payload is refused at enqueue
};

class Client {
 public:
  // Connects at once: to `database_url`, or to $DATABASE_URL when it is empty. Throws
  // ConfigError when neither is set, pqxx::broken_connection when the database is unreachable.
  // When the server ends the session (a restart, a failover), the next call throws a connection
  // error and a later call opens a new session by itself. A call that threw a connection error
  // may have enqueued its jobs (the answer to a committed statement can be lost): retry with the
  // same idempotency keys to be sure of one job each.
  explicit Client(const std::string& database_url = "", ClientOptions options = {});
  explicit Client(const std::string& database_url, std::string schema)
      : Client(database_url, ClientOptions{.schema = std::move(schema)}) {}
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Enqueues one job and returns its id (with an idempotency key that is live already: the
  // existing job's id, and nothing is inserted). The leader is woken by NOTIFY.
  std::int64_t enqueue(std::string_view type, const nlohmann::json& payload,
                       const EnqueueOptions& options = {});
  // The payload as JSON text (checked to parse).
  std::int64_t enqueue_json(std::string_view type, std::string_view payload_json,
                            const EnqueueOptions& options = {});
  // Enqueues `count` copies of one job in one statement; returns their ids.
  std::vector<std::int64_t> enqueue_copies(std::string_view type, const nlohmann::json& payload,
                                           int count, const EnqueueOptions& options = {});
  // Enqueues many jobs of one type, one payload each, in one statement; returns their ids.
  std::vector<std::int64_t> enqueue_many(std::string_view type,
                                         const std::vector<nlohmann::json>& payloads,
                                         const EnqueueOptions& options = {});
  // Enqueues jobs with options of their own, in one statement, one NOTIFY per queue. Returns the
  // ids of the jobs inserted, in order; a job whose idempotency key is live already is skipped.
  std::vector<std::int64_t> enqueue_batch(const std::vector<NewJob>& jobs);
  // The same, with the jobs as the SQL API's JSON objects: "type" and any of queue, payload,
  // priority, run_at, delay_ms, max_attempts, partition_key, idempotency_key, timeout_ms. The
  // database checks every key and value; EnqueueError names the first bad one.
  std::vector<std::int64_t> enqueue_objects(const nlohmann::json& jobs);

  // Declares `queue` ordered with `partitions` partitions (1..4096): jobs with the same
  // partition_key run one at a time, in enqueue order. Declare before enqueueing.
  void declare_ordered_queue(std::string_view queue, int partitions);

  // Cancels a job (see CancelResult): one not started yet never runs; a running one sees
  // JobContext::cancelled() and ends as cancelled. Needs EXECUTE on baton.cancel.
  CancelResult cancel(std::int64_t id);
  // Cancels the job enqueued with this idempotency key (the live one). not_found when none.
  CancelResult cancel(std::string_view queue, std::string_view idempotency_key);
  // Where the job is now; nullopt when there is no such job (or its history was pruned).
  // Needs EXECUTE on baton.job_status.
  std::optional<JobStatus> status(std::int64_t id);
  // The job enqueued with this idempotency key: the live one, else the newest finished one.
  std::optional<JobStatus> status(std::string_view queue, std::string_view idempotency_key);

  // Typed form: T needs to_json and a static `type_name` (e.g. "send_email").
  template <class T>
  requires requires { T::type_name; }
  std::int64_t enqueue(const T& job, const EnqueueOptions& options = {}) {
    return enqueue(T::type_name, nlohmann::json(job), options);
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Enqueues inside the caller's transaction: the jobs exist only if it commits (and the leader is
// woken at that commit). Returns the ids as enqueue_batch does.
std::vector<std::int64_t> enqueue_in(pqxx::transaction_base& tx, const std::vector<NewJob>& jobs,
                                     const ClientOptions& options = {});

}  // namespace baton
