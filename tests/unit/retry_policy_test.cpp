// Retry backoff: exponential, capped, jittered within [ceiling/2, ceiling].
#include <gtest/gtest.h>

#include "baton/detail/retry_policy.h"

namespace {

using baton::detail::RetryPolicy;
using std::chrono::milliseconds;

TEST(RetryPolicy, DoublesUpToTheCap) {
  RetryPolicy p{milliseconds(100), milliseconds(1000)};
  EXPECT_EQ(p.ceiling(1), milliseconds(100));
  EXPECT_EQ(p.ceiling(2), milliseconds(200));
  EXPECT_EQ(p.ceiling(4), milliseconds(800));
  EXPECT_EQ(p.ceiling(5), milliseconds(1000));
  EXPECT_EQ(p.ceiling(500), milliseconds(1000)) << "huge attempt counts must not overflow";
}

TEST(RetryPolicy, JitterStaysWithinBoundsAndVaries) {
  RetryPolicy p{milliseconds(1000), milliseconds(3600 * 1000)};
  std::mt19937_64 rng(42);
  for (int attempt = 1; attempt <= 12; ++attempt) {
    std::set<long long> seen;
    for (int i = 0; i < 200; ++i) {
      const auto d = p.delay(attempt, rng);
      EXPECT_GE(d, p.ceiling(attempt) / 2);
      EXPECT_LE(d, p.ceiling(attempt));
      seen.insert(d.count());
    }
    EXPECT_GT(seen.size(), 10u) << "no jitter at attempt " << attempt;
  }
}

}  // namespace
