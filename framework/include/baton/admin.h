// Admin: an operator's actions on one deployment (schema): pause and resume queues, requeue,
// discard and purge dead letters, cancel jobs, ask the leader to step down. batonctl, the
// console and your own tools call the same code; each call is one transaction, and the queue
// actions record `actor` as who did it.
//
// Not safe to share between threads (one connection); give each thread its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <pqxx/connection>

#include "baton/job.h"

namespace baton {

// Thrown for a bad argument (a queue name, a count). The message says what to fix.
class AdminError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Admin {
 public:
  // Connects at once; throws pqxx::broken_connection when the database is unreachable. When the
  // server ends the session (a restart, a failover), the next call throws a connection error
  // and a later call opens a new session by itself.
  Admin(const std::string& database_url, std::string schema = "baton", std::string actor = "admin");
  // Works on a connection of the caller's (which must outlive the Admin).
  Admin(pqxx::connection& conn, std::string schema, std::string actor);
  ~Admin();
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // Pauses (the leader claims none of the queue's jobs) or resumes a queue, and wakes the
  // leader. Returns false when the queue has never had a job or a setting (likely a typo); the
  // setting is recorded anyway.
  bool set_paused(std::string_view queue, bool paused);
  // Declares `queue` ordered with `partitions` partitions (1..4096).
  void declare_ordered(std::string_view queue, int partitions);

  // Puts dead job `id` back in the queue, same id, fresh attempts. False when there is none.
  bool retry_dead(std::int64_t id);
  // Every dead job (of `queue`, when given) back in the queue. Returns how many.
  std::int64_t retry_dead_all(std::string_view queue = {});
  // Deletes dead job `id` for good. False when there is none.
  bool discard_dead(std::int64_t id);
  // Deletes dead jobs that died longer than `older_than` ago (of `queue`, when given).
  std::int64_t purge_dead(std::chrono::milliseconds older_than, std::string_view queue = {});

  CancelResult cancel(std::int64_t id);

  // Asks the leader (`node`, or "*" for whichever node leads) to drain and step down; the
  // request is a row the leader reads, recording who asked. Returns the request's id.
  std::int64_t request_step_down(std::string_view node = "*", std::string_view note = {});

 private:
  std::unique_ptr<pqxx::connection> owned_;
  pqxx::connection* conn_;
  std::string schema_;
  std::string actor_;
};

}  // namespace baton
