// The fencing compare-and-set at the job store, against a real PostgreSQL: a claim needs the
// lock row to show the claimer's epoch, and every outcome needs the job to still be running under
// the epoch that claimed it.
#include <gtest/gtest.h>

#include <thread>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/migrations.h"
#include "support/support.h"

namespace {

using namespace baton::test;
namespace detail = baton::detail;

class Fencing : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = unique_schema(::testing::UnitTest::GetInstance()->current_test_info()->name());
    conn_ = detail::connect({.url = database_url(), .schema = schema_});
    detail::migrate(*conn_, schema_);
    {
      pqxx::nontransaction tx(*conn_);
      tx.exec("INSERT INTO jobs (queue, type) SELECT 'q', 'noop' FROM generate_series(1, 3)");
    }
    lead("old", 1);
  }
  // Makes the lock row say that `node` leads at `epoch`.
  void lead(const std::string& node, long long epoch) {
    pqxx::nontransaction tx(*conn_);
    tx.exec_params(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('k', 'r', $1, $2, now() + interval '1 minute') ON CONFLICT (lock_key, region) "
        "DO UPDATE SET client_id = excluded.client_id, epoch = excluded.epoch",
        node, epoch);
  }
  std::vector<detail::ClaimedJob> claim(const std::string& node, long long epoch) {
    return detail::claim_jobs(*conn_, {"k", "r"}, node, epoch, 10, {});
  }
  long long count(const std::string& sql) { return query_int(*conn_, sql); }

  std::string schema_;
  std::unique_ptr<pqxx::connection> conn_;
};

TEST_F(Fencing, AClaimNeedsTheLockRowToShowTheClaimersEpoch) {
  EXPECT_TRUE(claim("old", 2).empty()) << "claimed with an epoch the lock row does not show";
  EXPECT_TRUE(claim("someone", 1).empty()) << "claimed as a node that does not hold the lock";
  EXPECT_EQ(claim("old", 1).size(), 3u);
}

TEST_F(Fencing, ADeposedLeadersOutcomesAreRefusedAfterTheRescue) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  lead("new", 2);
  EXPECT_EQ(detail::rescue_older_epochs(*conn_, 2), 3u);
  // The old leader finishes late: completion, retry and dead-lettering are all fenced.
  EXPECT_EQ(detail::apply_outcomes(*conn_, {{jobs[0].job.id, 1, 0.1, 1}},
                                   {{jobs[1].job.id, 1, 1, "late", false, "", 10},
                                    {jobs[2].job.id, 1, 1, "late", true, "exhausted", 0}}),
            0u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available'"), 3);
  // The new epoch claims and completes them.
  auto again = claim("new", 2);
  ASSERT_EQ(again.size(), 3u);
  std::vector<detail::Completion> done;
  for (const auto& j : again)
    done.push_back({j.job.id, 2, 0.1, 2});
  EXPECT_EQ(detail::apply_outcomes(*conn_, done, {}), 3u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE epoch = 2 AND attempts = 2"), 3);
}

TEST_F(Fencing, AReleasedClaimGoesBackWithItsAttemptAndAStaleReleaseIsIgnored) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  // Released by the epoch that claimed them: available again, as if never claimed.
  detail::apply_outcomes(*conn_, {}, {}, nullptr, {{jobs[0].job.id, 1, 1}, {jobs[1].job.id, 1, 1}});
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND attempts = 0 "
                  "AND first_started_at IS NULL AND claimed_by IS NULL"),
            2);
  // A release from another epoch, or of another attempt, matches nothing.
  lead("new", 2);
  EXPECT_EQ(detail::rescue_older_epochs(*conn_, 2), 1u);
  auto again = claim("new", 2);
  ASSERT_EQ(again.size(), 3u);
  detail::apply_outcomes(*conn_, {}, {}, nullptr,
                         {{jobs[2].job.id, 1, 1}, {again[0].job.id, 2, again[0].job.attempt + 1}});
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running' AND claimed_epoch = 2"), 3);
}

TEST_F(Fencing, AFencedTransactionalCommitRollsBackTheHandlersWrites) {
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("CREATE TABLE effects (job_id bigint)");
  }
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  lead("new", 2);
  detail::rescue_older_epochs(*conn_, 2);
  auto again = claim("new", 2);
  ASSERT_EQ(again.size(), 3u);

  auto handler_conn = detail::connect({.url = database_url(), .schema = schema_});
  {
    pqxx::work tx(*handler_conn);
    tx.exec_params("INSERT INTO effects VALUES ($1)", jobs[0].job.id);
    EXPECT_FALSE(detail::complete_in(tx, {jobs[0].job.id, 1, 0.1, 1})) << "epoch 1 is deposed";
    tx.abort();
  }
  {
    pqxx::work tx(*handler_conn);
    tx.exec_params("INSERT INTO effects VALUES ($1)", jobs[0].job.id);
    EXPECT_TRUE(detail::complete_in(tx, {jobs[0].job.id, 2, 0.1, 2}));
    tx.commit();
  }
  EXPECT_EQ(count("SELECT count(*) FROM effects"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 1);
}

TEST_F(Fencing, TheRescueSkipsRowsLockedByAnUnfinishedCommit) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  // The old leader is inside its completion transaction, holding the row lock.
  auto stale = detail::connect({.url = database_url(), .schema = schema_});
  pqxx::work stale_tx(*stale);
  ASSERT_TRUE(detail::complete_in(stale_tx, {jobs[0].job.id, 1, 0.1, 1}));
  lead("new", 2);
  EXPECT_EQ(detail::rescue_older_epochs(*conn_, 2), 2u) << "must not wait on the locked row";
  stale_tx.commit();  // it committed first, so it counts: the job ran once
  EXPECT_EQ(detail::rescue_older_epochs(*conn_, 2), 0u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 2);
}

TEST_F(Fencing, ACompletionFindsItsJobEvenAfterTheRowMoved) {
  // Completions find rows by the address the claim returned. VACUUM FULL moves rows (and may
  // put another job where one was); the completion must still complete exactly its own job.
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  ASSERT_FALSE(jobs[0].row_at.empty());
  { pqxx::nontransaction(*conn_).exec("VACUUM FULL jobs"); }
  ASSERT_NE(query_int(*conn_, "SELECT count(*) FROM jobs WHERE ctid::text = '" + jobs[0].row_at +
                                  "' AND id = " + std::to_string(jobs[0].job.id)),
            1)
      << "VACUUM FULL did not move the row; the test shows nothing";
  std::vector<detail::Completion> done;
  for (const auto& j : {jobs[0], jobs[1]})
    done.push_back({j.job.id, 1, 0.1, 1, "q", "noop", j.row_at});
  EXPECT_EQ(detail::apply_outcomes(*conn_, done, {}), 2u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 2);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE id = " + std::to_string(jobs[2].job.id) +
                  " AND state = 'running'"),
            1)
      << "another job's row was completed in its place";
}

TEST_F(Fencing, ClaimsRacingAcrossAHandoverNeverTakeAJobTwice) {
  // The deposed leader's claim has updated the first job but not committed when the new leader
  // claims. The new claim waits for that row, then sees it taken and leaves it.
  auto stale = detail::connect({.url = database_url(), .schema = schema_});
  pqxx::work stale_tx(*stale);
  const auto first = query_int(*conn_, "SELECT min(id) FROM jobs");
  stale_tx.exec_params(
      "UPDATE jobs SET state = 'running', attempts = attempts + 1, claimed_by = 'old', "
      "claimed_epoch = 1 WHERE id = $1",
      first);
  lead("new", 2);
  std::vector<detail::ClaimedJob> taken;
  std::thread claimer([&] {
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    taken = detail::claim_jobs(*conn, {"k", "r"}, "new", 2, 10, {});
  });
  const bool waited = wait_for(
      [&] {
        return count(
                   "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND query LIKE '%UPDATE jobs j%'") == 1;
      },
      10s);
  stale_tx.commit();
  claimer.join();
  ASSERT_TRUE(waited) << "the new leader's claim never waited for the row the old one updated";
  EXPECT_EQ(taken.size(), 2u);
  for (const auto& j : taken)
    EXPECT_NE(j.job.id, first) << "the job the deposed leader claimed was claimed again";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE claimed_epoch = 2"), 2);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE claimed_epoch = 1 AND attempts = 1"), 1);
}

}  // namespace
