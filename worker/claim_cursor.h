// Where the leader's next claim of one kind (its queues) starts its index scan.
//
// A claim from the beginning of the claim index steps over the entries of every job claimed since
// the last vacuum: 17 ms for 1.2M of them, against 0.5 ms started after the last job claimed
// (docs/performance.md). So while claims come back full (a backlog), the next one starts after
// the last job claimed. Jobs that sort before that place (a higher priority, an earlier run_at, a
// job put back, the next job of an ordered partition) are found by the claims that still start
// from the beginning:
//   * after a claim that came back short (it reached the end of what was due);
//   * once `period` has passed since the last claim from the beginning: ten times as long as that
//     claim took, at least 50 ms and at most 1 s;
//   * for 10 s after a job of an ordered partition was claimed, so that the partition's next job
//     is claimed as soon as its predecessor has ended, as without a cursor.
// A claim that failed (cut, or an error) changes nothing. Not thread-safe: the claiming thread's.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "baton/detail/job_store.h"

namespace baton::worker {

class ClaimCursor {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kMinPeriod{50};
  static constexpr std::chrono::milliseconds kMaxPeriod{1000};
  static constexpr std::chrono::seconds kAfterPartitioned{10};

  // The place the claim starting at `now` starts after; none: from the beginning.
  std::optional<detail::ClaimKey> next(Clock::time_point now) const {
    if (!after_ || now >= next_full_ || now < partitioned_until_) return std::nullopt;
    return after_;
  }

  // A claim that started at `start` after `from` (none: from the beginning), asked for `want`
  // jobs, came back at `end` with `jobs`.
  void claimed(const std::optional<detail::ClaimKey>& from, int want,
               const std::vector<detail::ClaimedJob>& jobs, Clock::time_point start,
               Clock::time_point end) {
    if (!from) {
      const auto took = std::chrono::duration_cast<Clock::duration>(10 * (end - start));
      next_full_ = end + std::clamp<Clock::duration>(took, kMinPeriod, kMaxPeriod);
    }
    after_.reset();
    if (!jobs.empty() && static_cast<int>(jobs.size()) >= want) {
      detail::ClaimKey last = jobs.front().key;
      for (const auto& j : jobs)
        last = std::max(last, j.key);
      after_ = last;
    }
    for (const auto& j : jobs) {
      if (j.partitioned) partitioned_until_ = end + kAfterPartitioned;
    }
  }

 private:
  std::optional<detail::ClaimKey> after_;
  Clock::time_point next_full_{};
  Clock::time_point partitioned_until_{};
};

}  // namespace baton::worker
