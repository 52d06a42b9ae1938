// Interfaces through which the worker and the elector report what happens, so that metrics/ can
// count it without either of them knowing about Prometheus. Implementations must be thread-safe:
// they are called from the pool, the poller, the completer and the elector at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace baton::detail {

enum class Outcome { completed, retried, dead };

class JobObserver {
 public:
  virtual ~JobObserver() = default;
  virtual void job_started(std::string_view queue, std::string_view type, double wait_seconds) = 0;
  virtual void job_finished(std::string_view queue, std::string_view type, Outcome outcome,
                            double run_seconds) = 0;
  // Outcomes the database refused because the job was no longer this epoch's.
  virtual void jobs_fenced(std::size_t count) = 0;
  virtual void pool_busy(int busy, int threads) = 0;
};

class LeaderObserver {
 public:
  virtual ~LeaderObserver() = default;
  virtual void granted(std::int64_t epoch) = 0;
  virtual void revoked(std::int64_t epoch, std::string_view reason) = 0;
  virtual void renewal_failed() = 0;
  virtual void evicted_holder() = 0;
};

}  // namespace baton::detail
