// How long a failed job waits before its next attempt. Pure, so that it is unit-tested alone.
#pragma once

#include <chrono>
#include <random>

namespace baton::detail {

struct RetryPolicy {
  std::chrono::milliseconds base{1000};
  std::chrono::milliseconds cap{3600 * 1000};
  double factor = 2.0;

  // The un-jittered delay after `attempt` (1-based) failed: min(cap, base * factor^(attempt-1)).
  std::chrono::milliseconds ceiling(int attempt) const;
  // The jittered delay, uniform in [ceiling/2, ceiling]. `rng` is the caller's (not shared).
  std::chrono::milliseconds delay(int attempt, std::mt19937_64& rng) const;
};

}  // namespace baton::detail
