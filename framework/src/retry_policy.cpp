// Exponential backoff with jitter, capped.
#include "baton/detail/retry_policy.h"

#include <algorithm>
#include <cmath>

namespace baton::detail {

std::chrono::milliseconds RetryPolicy::ceiling(int attempt) const {
  const int steps = std::clamp(attempt - 1, 0, 1000);
  const double ms = static_cast<double>(base.count()) * std::pow(factor, steps);
  return std::chrono::milliseconds(
      static_cast<std::int64_t>(std::min(ms, static_cast<double>(cap.count()))));
}

std::chrono::milliseconds RetryPolicy::delay(int attempt, std::mt19937_64& rng) const {
  const auto top = ceiling(attempt).count();
  std::uniform_int_distribution<std::int64_t> pick(top / 2, top);
  return std::chrono::milliseconds(pick(rng));
}

}  // namespace baton::detail
