// Handlers: what a job type runs, and how a handler says that a job must never be retried.
#pragma once

#include <functional>
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
