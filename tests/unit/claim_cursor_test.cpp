// When the leader's claims start after the last job claimed, and when from the beginning
// (worker/claim_cursor.h): the rules that bound how long a job that sorts first may wait.
#include "worker/claim_cursor.h"

#include <gtest/gtest.h>

namespace {

using baton::detail::ClaimedJob;
using baton::detail::ClaimKey;
using baton::worker::ClaimCursor;
using namespace std::chrono_literals;

ClaimedJob job(std::int64_t id, int priority = 0, bool partitioned = false) {
  ClaimedJob j;
  j.key = {priority, 1000, id};
  j.partitioned = partitioned;
  return j;
}

const ClaimCursor::Clock::time_point t0{};

TEST(ClaimCursor, AFullClaimMovesThePlaceToItsLastJobAndAShortOneBackToTheBeginning) {
  ClaimCursor c;
  EXPECT_FALSE(c.next(t0)) << "the first claim starts from the beginning";
  c.claimed(std::nullopt, 3, {job(7), job(5, -1), job(9)}, t0, t0 + 1ms);
  ASSERT_TRUE(c.next(t0 + 2ms));
  EXPECT_EQ(c.next(t0 + 2ms)->id, 9) << "the last in claim order, not the last returned";
  c.claimed(c.next(t0 + 2ms), 3, {job(10), job(11), job(12)}, t0 + 2ms, t0 + 3ms);
  EXPECT_EQ(c.next(t0 + 4ms)->id, 12);
  c.claimed(c.next(t0 + 4ms), 3, {job(13)}, t0 + 4ms, t0 + 5ms);
  EXPECT_FALSE(c.next(t0 + 6ms)) << "after a short claim, the next starts from the beginning";
}

TEST(ClaimCursor, AClaimFromTheBeginningComesBackAfterTenTimesItsDurationWithinBounds) {
  ClaimCursor c;
  // A claim of 1 ms: the next from the beginning after 50 ms (the floor).
  c.claimed(std::nullopt, 1, {job(1)}, t0, t0 + 1ms);
  EXPECT_TRUE(c.next(t0 + 50ms));
  EXPECT_FALSE(c.next(t0 + 51ms));
  // A claim of 30 ms: after 300 ms.
  const auto t1 = t0 + 100ms;
  c.claimed(std::nullopt, 1, {job(2)}, t1, t1 + 30ms);
  EXPECT_TRUE(c.next(t1 + 329ms));
  EXPECT_FALSE(c.next(t1 + 330ms));
  // Cursor claims do not move that moment.
  c.claimed(c.next(t1 + 200ms), 1, {job(3)}, t1 + 200ms, t1 + 201ms);
  EXPECT_FALSE(c.next(t1 + 330ms));
  // A claim that stalled for 30 s (lock waits, I/O): still at most 1 s.
  const auto t2 = t0 + 1min;
  c.claimed(std::nullopt, 1, {job(4)}, t2, t2 + 30s);
  EXPECT_TRUE(c.next(t2 + 30s + 999ms));
  EXPECT_FALSE(c.next(t2 + 31s));
}

TEST(ClaimCursor, AJobOfAnOrderedPartitionSendsClaimsToTheBeginningForTenSeconds) {
  ClaimCursor c;
  c.claimed(std::nullopt, 2, {job(1), job(2, 0, true)}, t0, t0 + 100ms);
  EXPECT_FALSE(c.next(t0 + 200ms));
  EXPECT_FALSE(c.next(t0 + 10s + 99ms));
  // Ten seconds on, with claims from the beginning coming back full all along (each 1 ms).
  const auto t1 = t0 + 10s + 100ms;
  c.claimed(std::nullopt, 1, {job(3)}, t1, t1 + 1ms);
  EXPECT_TRUE(c.next(t1 + 2ms));
}

}  // namespace
