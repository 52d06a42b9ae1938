// Handlers: what a job type runs, and how a handler says that a job must never be retried.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>

#include <pqxx/transaction>

#include "baton/job.h"

namespace baton {

// Returning means done; throwing anything means this attempt failed (retried with backoff, then
// dead-lettered). Handlers run on the leader's thread pool, several at once.
using Handler = std::function<void(JobContext&)>;

// A transactional handler writes through `tx`; its writes commit in the same transaction as the
// job's completion, and only if the job is still this epoch's: a deposed leader's writes roll
// back (fenced), so they apply exactly once. Throwing rolls them back and fails the attempt.
using TxHandler = std::function<void(JobContext&, pqxx::work& tx)>;

// Per-type settings of a handler; unset fields take the node's.
struct HandlerOptions {
  std::optional<std::chrono::milliseconds> retry_base{};  // delay after the first failure
  std::optional<std::chrono::milliseconds> retry_cap{};   // longest delay
  double retry_factor = 2.0;  // each further failure multiplies the delay by this (1..10)
};

// Throw to fail this attempt and run the job again after exactly `delay` (still counted as an
// attempt: with none left the job is dead-lettered).
class RetryIn : public std::runtime_error {
 public:
  RetryIn(std::chrono::milliseconds delay, const std::string& reason)
      : std::runtime_error(reason), delay_(delay) {}
  std::chrono::milliseconds delay() const { return delay_; }

 private:
  std::chrono::milliseconds delay_;
};

// Throw to move the job to dead_jobs at once, without further attempts.
class Discard : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by typed handlers when the payload does not map to the type: the job dies at once.
class PayloadError : public Discard {
 public:
  using Discard::Discard;
};

}  // namespace baton
