// The fencing compare-and-set at the job store, against a real PostgreSQL: a claim needs the
// lock row to show the claimer's epoch, and every outcome needs the job to still be running under
// the claim that produced it (epoch and token); epochs compare only within one lock group.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/migrations.h"
#include "support/support.h"
#include "worker/completer.h"
#include "worker/poller.h"

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
  static detail::Claimer as(const std::string& node, long long epoch) {
    return {{"k", "r"}, node, epoch};
  }
  std::vector<detail::ClaimedJob> claim(const std::string& node, long long epoch) {
    return detail::claim_jobs(*conn_, as(node, epoch), 10, {{}, {}, {"noop"}});
  }
  // Changes the first job's row with `update` ($1: its id) in a transaction of its own, has
  // `node` claim at `epoch` while that transaction holds the row, then commits it: the claim
  // waits for the row, then re-checks it. The claim scans its address list, as on a real queue
  // (three rows alone would be read by a sequential scan, whose re-check differs).
  struct Race {
    std::int64_t first = 0;                 // the job whose row was changed
    std::vector<detail::ClaimedJob> taken;  // what the claim took
    bool waited = false;                    // whether the claim waited for the row
  };
  Race claim_racing(const std::string& update, const std::string& node, long long epoch) {
    Race race;
    auto other = detail::connect({.url = database_url(), .schema = schema_});
    pqxx::work other_tx(*other);
    race.first = query_int(*conn_, "SELECT min(id) FROM jobs");
    other_tx.exec_params(update, race.first);
    lead(node, epoch);
    // The claim's own session, by its pid: other tests' claims may wait on the same server.
    std::atomic<int> claimer_pid{0};
    std::thread claimer([&] {
      auto conn = detail::connect({.url = database_url(), .schema = schema_});
      pqxx::nontransaction(*conn).exec("SET enable_seqscan = off");
      claimer_pid = conn->backendpid();
      race.taken = detail::claim_jobs(*conn, as(node, epoch), 10, {{}, {}, {"noop"}});
    });
    race.waited = wait_for(
        [&] {
          return count(
                     "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                     "AND query LIKE '%UPDATE jobs j%' AND pid = " +
                     std::to_string(claimer_pid.load())) == 1;
        },
        10s);
    other_tx.commit();
    claimer.join();
    return race;
  }
  detail::Rescued rescue(const std::string& node, long long epoch,
                         const std::vector<std::int64_t>& still_running = {}) {
    return detail::rescue_lost(*conn_, as(node, epoch), still_running, std::chrono::seconds(30));
  }
  static detail::Completion done(const detail::ClaimedJob& j) {
    return {j.job.id, j.job.epoch, j.token, 0.1, "q", "noop"};
  }
  static detail::Failure failed(const detail::ClaimedJob& j, bool dead = false) {
    return {j.job.id, j.job.epoch, j.token, j.job.attempt, "late", dead, dead ? "exhausted" : "",
            10};
  }
  static detail::Release released(const detail::ClaimedJob& j) {
    return {j.job.id, j.job.epoch, j.token};
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
  EXPECT_EQ(rescue("new", 2).requeued, 3u);
  // The old leader finishes late: completion, retry and dead-lettering are all fenced.
  EXPECT_EQ(
      detail::apply_outcomes(*conn_, {done(jobs[0])}, {failed(jobs[1]), failed(jobs[2], true)}),
      0u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available'"), 3);
  // The new epoch claims and completes them.
  auto again = claim("new", 2);
  ASSERT_EQ(again.size(), 3u);
  std::vector<detail::Completion> completions;
  for (const auto& j : again)
    completions.push_back(done(j));
  EXPECT_EQ(detail::apply_outcomes(*conn_, completions, {}), 3u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE epoch = 2 AND attempts = 2"), 3);
}

TEST_F(Fencing, AReleasedClaimGoesBackWithItsAttemptAndAStaleReleaseIsIgnored) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  // Released by the epoch that claimed them: available again, as if never claimed.
  detail::apply_outcomes(*conn_, {}, {}, nullptr, {released(jobs[0]), released(jobs[1])});
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND attempts = 0 "
                  "AND first_started_at IS NULL AND claimed_by IS NULL"),
            2);
  // A release from another epoch, or of another claim, matches nothing.
  lead("new", 2);
  EXPECT_EQ(rescue("new", 2).requeued, 1u);
  auto again = claim("new", 2);
  ASSERT_EQ(again.size(), 3u);
  detail::apply_outcomes(*conn_, {}, {}, nullptr,
                         {released(jobs[2]), {again[0].job.id, 2, again[0].token + 1}});
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
  rescue("new", 2);
  auto again = claim("new", 2);
  ASSERT_EQ(again.size(), 3u);

  auto handler_conn = detail::connect({.url = database_url(), .schema = schema_});
  {
    pqxx::work tx(*handler_conn);
    tx.exec_params("INSERT INTO effects VALUES ($1)", jobs[0].job.id);
    EXPECT_FALSE(detail::complete_in(tx, done(jobs[0]))) << "epoch 1 is deposed";
    tx.abort();
  }
  {
    pqxx::work tx(*handler_conn);
    tx.exec_params("INSERT INTO effects VALUES ($1)", jobs[0].job.id);
    const auto mine = std::find_if(again.begin(), again.end(),
                                   [&](const auto& j) { return j.job.id == jobs[0].job.id; });
    ASSERT_NE(mine, again.end());
    EXPECT_TRUE(detail::complete_in(tx, done(*mine)));
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
  ASSERT_TRUE(detail::complete_in(stale_tx, done(jobs[0])));
  lead("new", 2);
  EXPECT_EQ(rescue("new", 2).requeued, 2u) << "must not wait on the locked row";
  stale_tx.commit();  // it committed first, so it counts: the job ran once
  EXPECT_EQ(rescue("new", 2).requeued, 0u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 2);
}

TEST_F(Fencing, ACompletionFindsItsJobEvenAfterTheRowMoved) {
  // VACUUM FULL moves rows (and may put another job where one was); a completion must still
  // complete exactly its own job, whatever the job's address was when it was claimed.
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  const auto address = [&](std::int64_t id) {
    pqxx::nontransaction tx(*conn_);
    return std::string(
        tx.exec_params("SELECT ctid::text FROM jobs WHERE id = $1", id)[0][0].c_str());
  };
  const auto was = address(jobs[0].job.id);
  { pqxx::nontransaction(*conn_).exec("VACUUM FULL jobs"); }
  ASSERT_NE(address(jobs[0].job.id), was)
      << "VACUUM FULL did not move the row; the test shows nothing";
  EXPECT_EQ(detail::apply_outcomes(*conn_, {done(jobs[0]), done(jobs[1])}, {}), 2u);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 2);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE id = " + std::to_string(jobs[2].job.id) +
                  " AND state = 'running'"),
            1)
      << "another job's row was completed in its place";
}

TEST_F(Fencing, AClaimedJobCarriesItsEnqueueTimeAndHowLongItWaited) {
  // Enqueued 90 s ago, due 30 s ago: the handler sees when it was enqueued, to the microsecond,
  // and the wait metrics count from run_at and from created_at to the claim's time.
  const auto id = count("SELECT min(id) FROM jobs");
  pqxx::nontransaction(*conn_).exec_params(
      "UPDATE jobs SET created_at = now() - interval '90.123456 s', "
      "run_at = now() - interval '30.5 s' WHERE id = $1",
      id);
  const auto jobs = claim("old", 1);
  const auto job = std::find_if(jobs.begin(), jobs.end(),
                                [&](const detail::ClaimedJob& j) { return j.job.id == id; });
  ASSERT_NE(job, jobs.end());
  const auto us = [&](const std::string& expr) {
    return count("SELECT (date_part('epoch', " + expr +
                 ") * 1000000)::bigint FROM jobs WHERE id = " + std::to_string(id));
  };
  EXPECT_EQ(
      std::chrono::duration_cast<std::chrono::microseconds>(job->job.enqueued_at.time_since_epoch())
          .count(),
      us("created_at"));
  EXPECT_EQ(job->claimed_at_us, us("claimed_at"));
  EXPECT_NEAR(job->wait_seconds, static_cast<double>(us("claimed_at - run_at")) / 1e6, 1e-6);
  EXPECT_NEAR(job->since_enqueue_seconds, static_cast<double>(us("claimed_at - created_at")) / 1e6,
              1e-6);
  EXPECT_GE(job->wait_seconds, 30.5);
  EXPECT_GE(job->since_enqueue_seconds, 90.123456);
}

TEST_F(Fencing, ABatchOfOutcomesCompletesItsOwnJobsAloneWhereverTheirIdsLie) {
  // A batch whose ids lie close together is completed through one range of the primary key, a
  // scattered one through its list: either way, only the listed jobs still running under their
  // claim leave, whatever else lies between them.
  pqxx::nontransaction(*conn_).exec(
      "INSERT INTO jobs (queue, type) SELECT 'q', 'noop' FROM generate_series(1, 37)");
  const auto jobs = detail::claim_jobs(*conn_, as("old", 1), 100, {{}, {}, {"noop"}});
  ASSERT_EQ(jobs.size(), 40u);
  for (std::size_t i = 1; i < jobs.size(); ++i)
    ASSERT_EQ(jobs[i].job.id, jobs[0].job.id + static_cast<std::int64_t>(i));
  // One job inside the close batch's range is released: waiting again, its claim's outcome stale.
  detail::apply_outcomes(*conn_, {}, {}, nullptr, {released(jobs[5])});
  // The completer's session settings (plans made once, no sequential scans).
  pqxx::nontransaction(*conn_).exec("SELECT pg_stat_force_next_flush()");
  conn_ = detail::connect(
      baton::worker::completion_session({.url = database_url(), .schema = schema_}));
  // Which path a batch took: PostgreSQL 15 and 16 count a scan of the primary key by a list of
  // ids as one index scan per id, and a scan of a range as one. (Flushing the counts needs 15;
  // from 17 a list's ids on one leaf page may be read in one scan, so the count tells nothing.)
  const auto version = count("SELECT current_setting('server_version_num')::int");
  const bool counted = version >= 150000 && version < 170000;
  auto pkey_scans = [&] {
    if (!counted) return 0LL;
    pqxx::nontransaction(*conn_).exec("SELECT pg_stat_force_next_flush()");
    return count(
        "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = 'jobs_pkey'::regclass");
  };
  const auto scans_before = pkey_scans();
  // The close batch: 20 of the first 30 jobs, every third one left out; plus two of those left
  // out, the released one and a running one under an outcome of an older claim.
  std::vector<detail::Completion> close;
  std::vector<std::int64_t> expected;
  for (std::size_t i = 0; i < 30; ++i) {
    if (i % 3 == 2) continue;
    close.push_back(done(jobs[i]));
    expected.push_back(jobs[i].job.id);
  }
  close.push_back(done(jobs[5]));
  auto older = done(jobs[8]);
  older.token -= 1;
  close.push_back(older);
  std::vector<std::int64_t> fenced;
  EXPECT_EQ(detail::apply_outcomes(*conn_, close, {}, &fenced), expected.size());
  std::sort(fenced.begin(), fenced.end());
  EXPECT_EQ(fenced, (std::vector<std::int64_t>{jobs[5].job.id, jobs[8].job.id}));
  const auto scans_close = pkey_scans();
  if (counted) {
    EXPECT_EQ(scans_close - scans_before, 1) << "the close batch was not read as a range";
  }
  // The scattered batch: the first and the last of the last ten, eight running between them.
  EXPECT_EQ(detail::apply_outcomes(*conn_, {done(jobs[39]), done(jobs[30])}, {}), 2u);
  if (counted) {
    EXPECT_EQ(pkey_scans() - scans_close, 2) << "the scattered batch was not read by id";
  }
  expected.push_back(jobs[30].job.id);
  expected.push_back(jobs[39].job.id);
  std::vector<std::int64_t> history;
  for (const auto& r : pqxx::nontransaction(*conn_).exec("SELECT id FROM job_history ORDER BY id"))
    history.push_back(r[0].as<std::int64_t>());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(history, expected);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running'"), 40 - 22 - 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND id = " +
                  std::to_string(jobs[5].job.id)),
            1);
}

TEST_F(Fencing, ClaimsRacingAcrossAHandoverNeverTakeAJobTwice) {
  // The deposed leader's claim has updated the first job but not committed when the new leader
  // claims. The new claim waits for that row, then sees it taken and leaves it.
  const auto race = claim_racing(
      "UPDATE jobs SET state = 'running', attempts = attempts + 1, claims = claims + 1, "
      "claimed_by = 'old', claimed_epoch = 1, claim_group = 'r/k' WHERE id = $1",
      "new", 2);
  ASSERT_TRUE(race.waited) << "the new leader's claim never waited for the row the old one updated";
  EXPECT_EQ(race.taken.size(), 2u);
  for (const auto& j : race.taken)
    EXPECT_NE(j.job.id, race.first) << "the job the deposed leader claimed was claimed again";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE claimed_epoch = 2"), 2);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE claimed_epoch = 1 AND attempts = 1"), 1);
}

TEST_F(Fencing, AClaimThatWaitedForARowLeavesItWhenItWasClaimedAndRetriedMeanwhile) {
  // A claim read the first job as due, then waited for its row: meanwhile another claim (a cut
  // claim still running on the server, or a deposed leader's) took it, ran it, and its retry put
  // it back an hour ahead. The row is available again, but not due: the waiting claim leaves it.
  const auto race = claim_racing(
      "UPDATE jobs SET attempts = attempts + 1, claims = claims + 1, "
      "run_at = now() + interval '1 hour' WHERE id = $1",
      "new", 2);
  ASSERT_TRUE(race.waited) << "the claim never waited for the row the other transaction updated";
  EXPECT_EQ(race.taken.size(), 2u);
  for (const auto& j : race.taken)
    EXPECT_NE(j.job.id, race.first) << "a job whose retry is an hour ahead was claimed at once";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND run_at > now() "
                  "AND attempts = 1"),
            1);
}

TEST_F(Fencing, TwoLockGroupsNeverRescueEachOthersJobs) {
  // Group r/k leads at epoch 1 and runs the jobs; group r/a leads at epoch 4 (epochs are per lock
  // row: 4 > 1 means nothing across groups).
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('a', 'r', 'other', 4, now() + interval '1 minute')");
  }
  const auto r =
      detail::rescue_lost(*conn_, {{"a", "r"}, "other", 4}, {}, std::chrono::seconds(30));
  EXPECT_EQ(r.requeued + r.dead, 0u) << "group r/a rescued group r/k's running jobs";
  EXPECT_EQ(detail::apply_outcomes(*conn_, {done(jobs[0]), done(jobs[1]), done(jobs[2])}, {}), 3u)
      << "group r/k's own outcomes were fenced";
}

TEST_F(Fencing, AGroupLeftWithoutALeaderHasItsJobsRescuedByAnother) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("UPDATE locks SET expires_at = now() - interval '1 hour'");
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('a', 'r', 'other', 1, now() + interval '1 minute')");
  }
  const auto r =
      detail::rescue_lost(*conn_, {{"a", "r"}, "other", 1}, {}, std::chrono::seconds(30));
  EXPECT_EQ(r.requeued, 3u) << "a group whose lease ran out an hour ago keeps its jobs forever";
  EXPECT_EQ(detail::apply_outcomes(*conn_, {done(jobs[0])}, {}), 0u);
}

TEST_F(Fencing, TheRescueFindsLeaderlessGroupsOnEitherSideOfItsOwnAndOnlyThose) {
  // The rescuer is group r/m. Groups sort before it (r/a live, then r/k whose lease ran out) and
  // after it (r/y live, then r/zz that never had a lock row); one running job has no group.
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("UPDATE locks SET expires_at = now() - interval '1 hour'");
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) VALUES "
        "('m', 'r', 'me', 7, now() + interval '1 minute'), "
        "('a', 'r', 'x', 1, now() + interval '1 minute'), "
        "('y', 'r', 'y', 1, now() + interval '1 minute')");
    tx.exec(
        "INSERT INTO jobs (queue, type, state, claim_group, claimed_epoch, claimed_by, attempts) "
        "SELECT 'q', 'noop', 'running', g, e, 'n', 1 FROM (VALUES ('r/a', 1), ('r/a', 1), "
        "('r/y', 1), ('r/zz', 1), ('r/m', 7), (NULL, 1)) AS v(g, e)");
  }
  const auto r = detail::rescue_lost(*conn_, {{"m", "r"}, "me", 7}, {}, std::chrono::seconds(30));
  EXPECT_EQ(r.requeued, 5u) << "r/k's three, r/zz's one and the one without a group";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running' AND claim_group IN "
                  "('r/a', 'r/y', 'r/m')"),
            4)
      << "a live group's jobs, or the rescuer's own under its epoch, were taken";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running' AND (claim_group IS NULL "
                  "OR claim_group IN ('r/k', 'r/zz'))"),
            0);
}

TEST_F(Fencing, TheRescueLeavesAJobThatWasRequeuedAndClaimedAgainAfterItLooked) {
  // Group r/k's lease ran out with many jobs running; group r/m rescues them. While its rescue
  // locks them one by one (in id order, the last job last), another node requeues the last job
  // and r/k's new leader claims it again: a live run, which the rescue must leave alone though
  // its row still says running in group r/k, the group the rescue found without a leader.
  constexpr int kJobs = 60000;
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("UPDATE locks SET expires_at = now() - interval '1 hour'");
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('m', 'r', 'me', 7, now() + interval '1 minute')");
  }
  auto other = detail::connect({.url = database_url(), .schema = schema_});
  auto xmax = [&](long long id) {
    return count("SELECT xmax::text::bigint FROM jobs WHERE id = " + std::to_string(id));
  };
  other->prepare(
      "again",
      "UPDATE jobs SET claims = claims + 1, attempts = attempts + 1, claimed_by = 'new', "
      "claimed_epoch = 2, claimed_at = now() WHERE id = $1 AND xmax::text = '0'");
  bool in_window = false;
  std::string failed;  // what went wrong on either side, which must not end the thread early
  long long last = 0;
  // The window lasts some 0.1 s; a test process that is not scheduled through it (two test
  // binaries on two cores) misses it, and the race is run again, up to three times.
  for (int race = 1; race <= 3 && !in_window && failed.empty(); ++race) {
    {
      pqxx::nontransaction tx(*conn_);
      tx.exec("DELETE FROM jobs");
      tx.exec_params(
          "INSERT INTO jobs (queue, type, state, claim_group, claimed_epoch, claimed_by, "
          "claimed_at, attempts, claims) SELECT 'q', 'noop', 'running', 'r/k', 1, 'old', now(), "
          "1, 1 FROM generate_series(1, $1)",
          kJobs);
      tx.exec("ANALYZE jobs");
    }
    last = count("SELECT max(id) FROM jobs");
    const auto before_last = count("SELECT max(id) FROM jobs WHERE id < " + std::to_string(last));
    std::thread rescuer([&] {
      try {
        auto conn = detail::connect({.url = database_url(), .schema = schema_});
        detail::rescue_lost(*conn, {{"m", "r"}, "me", 7}, {}, std::chrono::seconds(30));
      } catch (const std::exception& e) {
        failed += std::string("the rescue failed: ") + e.what();
      }
    });
    try {
      // Once the rescue locks its first job, its snapshot is taken: the requeue and the new
      // claim land after it, and before the rescue reaches the last job if the one before is
      // not yet locked once they committed.
      const auto first = count("SELECT min(id) FROM jobs");
      if (wait_for([&] { return xmax(first) != 0; }, 30s, 1ms)) {
        // The requeue and the new claim in one prepared statement: the rescue sees only the
        // row's newest version. A row the rescue has locked already is left (its xmax is set),
        // and the test says so.
        const auto again = pqxx::nontransaction(*other).exec_prepared("again", last);
        in_window = again.affected_rows() == 1 && xmax(before_last) == 0;
      }
    } catch (const std::exception& e) {
      failed += std::string(" the requeue and claim failed: ") + e.what();
    }
    rescuer.join();
  }
  ASSERT_EQ(failed, "");
  ASSERT_TRUE(in_window) << "in three races the requeue and the new claim never landed while "
                            "the rescue ran (before it reached the last job)";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND id <> " +
                  std::to_string(last)),
            kJobs - 1)
      << "the rescue did not requeue the lost jobs";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE id = " + std::to_string(last) +
                  " AND state = 'running' AND claimed_by = 'new' AND claimed_epoch = 2"),
            1)
      << "the rescue requeued a job that r/k's new leader had claimed again after the rescue "
         "looked: its run goes on, but it will run once more";
}

TEST_F(Fencing, AClaimAfterAPlaceInClaimOrderTakesOnlyTheJobsAfterIt) {
  {
    pqxx::nontransaction tx(*conn_);
    // Two more jobs: one first in claim order (priority -1), one in an ordered partition, and a
    // run_at with microseconds that must survive the trip to the node and back.
    tx.exec("UPDATE jobs SET run_at = '2026-01-02 03:04:05.123456+00'");
    tx.exec("INSERT INTO jobs (queue, type, priority) VALUES ('q', 'noop', -1)");
    tx.exec(
        "INSERT INTO jobs (queue, type, partition_key, partition, run_at) "
        "VALUES ('q', 'noop', 'p', 0, '2026-01-02 03:04:05.123457+00')");
    // The place travels as microseconds: a time printed in this style and zone ("IST") would
    // read back as Israel's time, not India's.
    tx.exec("SET DateStyle = 'SQL, DMY'");
    tx.exec("SET TimeZone = 'Asia/Kolkata'");
  }
  auto claim_from = [&](int limit, std::optional<detail::ClaimKey> after) {
    detail::ClaimFilter filter{{}, {}, {"noop"}};
    filter.after = std::move(after);
    return detail::claim_jobs(*conn_, as("old", 1), limit, filter);
  };
  auto first = claim_from(2, std::nullopt);
  ASSERT_EQ(first.size(), 2u);
  auto last = std::max(first[0].key, first[1].key);
  EXPECT_EQ(std::min(first[0].key, first[1].key).priority, -1);
  EXPECT_EQ(last.priority, 0);
  EXPECT_EQ(last.id, 1) << "claim order is priority, run_at, id";
  EXPECT_FALSE(first[0].partitioned || first[1].partitioned);

  // A job that sorts before the place is not seen from it; from the beginning it is.
  {
    pqxx::nontransaction(*conn_).exec(
        "INSERT INTO jobs (queue, type, priority) VALUES ('q', 'noop', -5)");
  }
  auto next = claim_from(10, last);
  ASSERT_EQ(next.size(), 3u) << "jobs 2 and 3 (same run_at, later ids), then the partition's";
  std::sort(next.begin(), next.end(), [](auto& a, auto& b) { return a.key < b.key; });
  EXPECT_EQ(next[0].key.id, 2);
  EXPECT_EQ(next[1].key.id, 3);
  EXPECT_TRUE(next[2].partitioned);
  EXPECT_EQ(next[2].key.run_at_us - next[1].key.run_at_us, 1);
  EXPECT_EQ(next[1].key.run_at_us, 1767323045123456) << "2026-01-02 03:04:05.123456+00";
  EXPECT_TRUE(claim_from(10, next[2].key).empty());
  auto rest = claim_from(10, std::nullopt);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].key.priority, -5);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running' AND claims = 1"), 6)
      << "a job was claimed twice, or not at all";
}

TEST_F(Fencing, AJobThatTakesItsNodeDownOnItsLastAttemptIsDeadAsCrashed) {
  { pqxx::nontransaction(*conn_).exec("UPDATE jobs SET max_attempts = 3"); }
  // Every claim "crashes" (the next epoch rescues it): three runs, then dead, never a fourth.
  long long epoch = 1;
  int runs = 0;
  for (int round = 0; round < 6; ++round) {
    lead("n" + std::to_string(epoch), epoch);
    rescue("n" + std::to_string(epoch), epoch);
    runs += static_cast<int>(claim("n" + std::to_string(epoch), epoch).size());
    ++epoch;
  }
  lead("last", epoch);
  const auto r = rescue("last", epoch);
  EXPECT_EQ(runs, 9) << "three jobs, three attempts each";
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE reason = 'crashed' AND attempts = 3"), 3);
  EXPECT_GE(r.dead, 0u);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE jsonb_array_length(errors) = 3 "
                  "AND last_error LIKE 'attempt 3 of 3 ended with its node%'"),
            3)
      << "every lost run is in the job's error history";
}

TEST_F(Fencing, AStaleOutcomeMissesAJobRequeuedFromTheDeadUnderTheSameEpoch) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  // The first run is refused as dead; an operator requeues it (fresh attempts); the same leader
  // claims it again, with the same epoch and attempt number as the first run.
  ASSERT_EQ(detail::apply_outcomes(*conn_, {}, {failed(jobs[0], true)}), 1u);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec(
        "INSERT INTO jobs (id, queue, type, max_attempts, claims) OVERRIDING SYSTEM VALUE "
        "SELECT id, queue, type, max_attempts, claims FROM dead_jobs");
    tx.exec("DELETE FROM dead_jobs");
  }
  auto again = claim("old", 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].job.attempt, jobs[0].job.attempt);
  EXPECT_NE(again[0].token, jobs[0].token);
  EXPECT_EQ(detail::apply_outcomes(*conn_, {done(jobs[0])}, {}), 0u)
      << "the first run's late completion settled the second run";
  EXPECT_EQ(detail::apply_outcomes(*conn_, {done(again[0])}, {}), 1u);
}

TEST_F(Fencing, TheRescueLeavesAloneTheJobsThisNodeStillRuns) {
  lead("me", 1);
  auto jobs = claim("me", 1);
  ASSERT_EQ(jobs.size(), 3u);
  lead("me", 2);  // the same node, regranted under the next epoch
  EXPECT_EQ(rescue("me", 2, {jobs[0].job.id, jobs[1].job.id}).requeued, 1u);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running' AND claimed_epoch = 1"), 2);
}

TEST_F(Fencing, OutcomesAndTheRescueReadOnlyTheRowsTheyNeedWhateverTheStatisticsSay) {
  // The table's statistics were taken while the queue was empty, as on a system left idle; then
  // a burst: 20,000 running jobs. With a join between the outcomes and the table, the planner took
  // the table as one row and read every running job once per outcome (20 s for 5,000); the rescues
  // read every running job every 2 s, or ran their search again for each (14 s); a claim read every
  // waiting job. Counted here in index entries and rows read.
  constexpr int kRunning = 20'000;
  constexpr int kDone = 5'000;
  if (count("SELECT current_setting('server_version_num')::int") < 150000)
    GTEST_SKIP() << "pg_stat_force_next_flush() needs PostgreSQL 15";
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("ALTER TABLE jobs SET (autovacuum_enabled = false)");
    tx.exec("DELETE FROM jobs");
    tx.exec("ANALYZE jobs");
    tx.exec(
        "INSERT INTO jobs (queue, type, state, attempts, claims, claimed_epoch, claimed_by, "
        "claimed_at, first_started_at, claim_group, timeout_ms) SELECT 'q', 'noop', 'running', "
        "1, 1, 1, 'old', now(), now(), 'r/k', CASE WHEN i % 200 = 0 THEN 3600000 END FROM "
        "generate_series(1, " +
        std::to_string(kRunning) + ") i");
  }
  {
    // And a backlog waiting behind them.
    pqxx::nontransaction tx(*conn_);
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'q', 'noop' FROM generate_series(1, " +
            std::to_string(kRunning / 2) + ")");
  }
  ASSERT_EQ(count("SELECT reltuples FROM pg_class WHERE oid = 'jobs'::regclass"), 0);
  // Rows read by sequential scans and entries read from indexes, as counted once this session's
  // statistics are flushed.
  auto reads = [&] {
    pqxx::nontransaction(*conn_).exec("SELECT pg_stat_force_next_flush()");
    return count(
        "SELECT coalesce(seq_tup_read, 0) + (SELECT "
        "sum(idx_tup_read) FROM pg_stat_user_indexes i WHERE i.relid = t.relid) FROM "
        "pg_stat_user_tables t WHERE t.relid = 'jobs'::regclass");
  };
  std::vector<detail::Completion> outcomes;
  {
    pqxx::nontransaction tx(*conn_);
    // Newest first, and one job twice: an outcome of an older claim (a lower token), which must
    // be fenced though its epoch is higher (epochs count per lock group; a job can change group).
    for (const auto& row :
         tx.exec("SELECT id FROM jobs WHERE state = 'running' ORDER BY id DESC LIMIT " +
                 std::to_string(kDone)))
      outcomes.push_back({row[0].as<std::int64_t>(), 1, 1, 0.1, "q", "noop"});
  }
  outcomes.push_back({outcomes[10].id, 2, 0, 0.1, "q", "noop"});
  // The completer's session plans the completion once for every batch. (This session's reads so
  // far are flushed first, to be counted before.)
  pqxx::nontransaction(*conn_).exec("SELECT pg_stat_force_next_flush()");
  conn_ = detail::connect(
      baton::worker::completion_session({.url = database_url(), .schema = schema_}));
  const auto before = reads();
  std::vector<std::int64_t> fenced;
  EXPECT_EQ(detail::apply_outcomes(*conn_, outcomes, {}, &fenced, {}), std::size_t{kDone});
  EXPECT_EQ(fenced, std::vector<std::int64_t>{outcomes[10].id});
  EXPECT_EQ(rescue("old", 1).requeued, 0u);
  // 100 jobs have a timeout, an hour away: the hung-job rescue reads those.
  EXPECT_EQ(detail::rescue_timed_out(*conn_, as("old", 1), 1000), 0u);
  // A claim of 10 reads about 10 waiting jobs.
  EXPECT_EQ(claim("old", 1).size(), 10u);
  const auto read = reads() - before;
  EXPECT_LE(read, kDone + 500) << "read " << read << " rows and index entries to complete " << kDone
                               << " jobs, find none lost among " << kRunning - kDone
                               << " and claim 10 of " << kRunning / 2 << " waiting";
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), kDone);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running'"), kRunning - kDone + 10);
}

TEST_F(Fencing, AClaimFromAPlaceReadsTheJobsItTakesNotTheBacklogWhateverTheServersCosts) {
  // A server whose planner expects every page read to miss its cache (effective_cache_size of one
  // page) prices the claim index's ordered scan above a bitmap scan of every due job past the
  // claim's place, then a sort. A claim is planned once per session: so planned, every claim of
  // a drain read the whole backlog behind its place (as claims did with the server's default
  // costs after a 5M-job drain, 45-160 ms each). Its order must come from the index whatever the
  // costs. Counted in claim index entries read by the poller's session, claiming as it does.
  constexpr int kWaiting = 20'000;
  constexpr int kBatch = 100;
  constexpr int kClaims = 5;
  if (count("SELECT current_setting('server_version_num')::int") < 150000)
    GTEST_SKIP() << "pg_stat_force_next_flush() needs PostgreSQL 15";
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("ALTER TABLE jobs SET (autovacuum_enabled = false)");
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'q', 'noop' FROM generate_series(1, " +
            std::to_string(kWaiting) + ")");
    tx.exec("ANALYZE jobs");
  }
  std::string url = database_url();
  const bool uri = url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0;
  if (uri) {
    url += std::string(url.find('?') == std::string::npos ? "?" : "&") +
           "options=-c%20effective_cache_size%3D8kB";
  } else {
    url += " options='-c effective_cache_size=8kB'";
  }
  detail::ConnectOptions options{.url = url, .schema = schema_};
  baton::worker::plan_claims(options);
  conn_ = detail::connect(options);
  ASSERT_EQ(query_value(*conn_, "SHOW effective_cache_size"), "8kB");
  auto claim_from = [&](std::optional<detail::ClaimKey> after) {
    detail::ClaimFilter filter{{}, {}, {"noop"}};
    filter.after = std::move(after);
    auto jobs = detail::claim_jobs(*conn_, as("old", 1), kBatch, filter);
    EXPECT_EQ(jobs.size(), std::size_t{kBatch});
    detail::ClaimKey last;
    for (const auto& j : jobs)
      last = std::max(last, j.key);
    return last;
  };
  auto reads = [&] {
    pqxx::nontransaction(*conn_).exec("SELECT pg_stat_force_next_flush()");
    return count(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = "
        "'jobs_claim_idx'::regclass");
  };
  auto place = claim_from(std::nullopt);
  const auto before = reads();
  for (int i = 0; i < kClaims; ++i)
    place = claim_from(place);
  const auto read = reads() - before;
  EXPECT_LE(read, 2 * kClaims * kBatch)
      << kClaims << " claims of " << kBatch << " from their places read " << read
      << " claim index entries among " << kWaiting << " waiting jobs";
}

TEST_F(Fencing, PlansMadeOnANearlyEmptyQueueReadOnlyTheRowsTheyNeedOnceItGrew) {
  // A leader that starts on an empty queue plans its claim and its completion once, on a table of
  // a few pages; a burst then fills it, and no ANALYZE comes in between to plan them again.
  // Planned as a sequential scan, each claim and each completion would read the whole table
  // (with 32 producers, 4,000-7,600 buffers a call, most of the leader's CPU). Counted here in
  // rows and index entries read.
  constexpr int kRunning = 20'000;
  constexpr int kDone = 100;
  if (count("SELECT current_setting('server_version_num')::int") < 150000)
    GTEST_SKIP() << "pg_stat_force_next_flush() needs PostgreSQL 15";
  pqxx::nontransaction(*conn_).exec("ALTER TABLE jobs SET (autovacuum_enabled = false)");
  // The completer's and the poller's session settings.
  auto both = baton::worker::completion_session({.url = database_url(), .schema = schema_});
  baton::worker::plan_claims(both);
  conn_ = detail::connect(both);
  // Planned now, on the fixture's three waiting jobs: all three claimed, one completed.
  const auto first = claim("old", 1);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(detail::apply_outcomes(*conn_, {{first[0].job.id, 1, first[0].token, 0.1, "q", "noop"}},
                                   {}, nullptr, {}),
            1u);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec(
        "INSERT INTO jobs (queue, type, state, attempts, claims, claimed_epoch, claimed_by, "
        "claimed_at, first_started_at, claim_group) SELECT 'q', 'noop', 'running', 1, 1, 1, "
        "'old', now(), now(), 'r/k' FROM generate_series(1, " +
        std::to_string(kRunning) + ")");
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'q', 'noop' FROM generate_series(1, " +
            std::to_string(kRunning / 2) + ")");
  }
  std::vector<detail::Completion> outcomes;
  for (const auto& row : pqxx::nontransaction(*conn_).exec(
           "SELECT id FROM jobs WHERE state = 'running' AND claimed_by = 'old' ORDER BY id DESC "
           "LIMIT " +
           std::to_string(kDone)))
    outcomes.push_back({row[0].as<std::int64_t>(), 1, 1, 0.1, "q", "noop"});
  auto reads = [&] {
    pqxx::nontransaction(*conn_).exec("SELECT pg_stat_force_next_flush()");
    return count(
        "SELECT coalesce(seq_tup_read, 0) + (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes "
        "i WHERE i.relid = t.relid) FROM pg_stat_user_tables t WHERE t.relid = 'jobs'::regclass");
  };
  const auto before = reads();
  EXPECT_EQ(detail::apply_outcomes(*conn_, outcomes, {}, nullptr, {}), std::size_t{kDone});
  EXPECT_EQ(claim("old", 1).size(), 10u);
  const auto read = reads() - before;
  EXPECT_LE(read, kDone + 500) << "read " << read << " rows and index entries to complete " << kDone
                               << " jobs and claim 10, among " << kRunning * 3 / 2
                               << " jobs, with plans made when the queue held 3";
}

TEST_F(Fencing, AClaimSkipsRowsAnotherTransactionHoldsWhenAsked) {
  auto operator_conn = detail::connect({.url = database_url(), .schema = schema_});
  pqxx::work held(*operator_conn);
  held.exec("SELECT * FROM jobs WHERE id = (SELECT min(id) FROM jobs) FOR UPDATE");
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("SET lock_timeout = 100");
  }
  EXPECT_THROW(claim("old", 1), pqxx::sql_error) << "a plain claim should wait for the row";
  const auto jobs = detail::claim_jobs(*conn_, as("old", 1), 10, {{}, {}, {"noop"}, true});
  EXPECT_EQ(jobs.size(), 2u) << "the claim that skips held rows took the others";
  held.abort();
}

TEST_F(Fencing, OnlyHandledTypesAreClaimed) {
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("INSERT INTO jobs (queue, type) VALUES ('q', 'new_type')");
  }
  EXPECT_EQ(claim("old", 1).size(), 3u);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE type = 'new_type' AND state = 'available'"), 1);
  EXPECT_EQ(detail::claim_jobs(*conn_, as("old", 1), 10, {{}, {}, {"noop", "new_type"}}).size(),
            1u);
}

TEST_F(Fencing, ACancelledJobEndsAsCancelledWhateverStateItWasIn) {
  auto jobs = claim("old", 1);
  ASSERT_EQ(jobs.size(), 3u);
  { pqxx::nontransaction(*conn_).exec("INSERT INTO jobs (queue, type) VALUES ('q', 'noop')"); }
  const auto waiting = query_int(*conn_, "SELECT max(id) FROM jobs");
  auto cancel = [&](std::int64_t id) {
    return query_value(*conn_, "SELECT cancel(" + std::to_string(id) + ")");
  };
  EXPECT_EQ(cancel(waiting), "cancelled");
  EXPECT_EQ(cancel(waiting), "finished");
  EXPECT_EQ(cancel(424242), "not_found");
  for (const auto& j : jobs)
    EXPECT_EQ(cancel(j.job.id), "cancelling");
  // A failed run, a run that never started, and a run that completed anyway.
  detail::apply_outcomes(*conn_, {done(jobs[2])}, {failed(jobs[0])}, nullptr, {released(jobs[1])});
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE outcome = 'cancelled'"), 3);
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE outcome = 'completed'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(query_value(*conn_, "SELECT status FROM job_status(" + std::to_string(waiting) + ")"),
            "cancelled");
}

}  // namespace
