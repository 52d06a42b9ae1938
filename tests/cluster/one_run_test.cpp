// One run of a job at a time, with real processes: a node that loses and regains leadership, a
// node frozen past its lease, an operator holding a job row, and the idempotency key a handler
// passes downstream, which must not change when the job runs again after a failover.
#include <gtest/gtest.h>

#include <signal.h>

#include <set>

#include "support/cluster.h"
#include "support/runs.h"

namespace {

using namespace baton::test;

TEST(OneRun, ANodeThatLosesAndRegainsLeadershipCancelsItsRunsBeforeRunningThemAgain) {
  Cluster cluster(unique_schema("regrant"), 0);
  const auto log = cluster.dir() + "/runs.log";
  cluster.start("n1", {"--run-log", log});
  ASSERT_EQ(cluster.wait_leader(20s), "n1") << cluster.logs();
  const auto epoch = cluster.epoch();
  enqueue(cluster, "record_run", R"({"ms": 1500})", 4);
  // Every run started (a claimed job may still wait for its thread: ending the epoch then
  // releases it unstarted, and it runs once).
  ASSERT_TRUE(wait_for([&] { return read_runs(log).size() == 4; }, 20s, 1ms)) << cluster.logs();
  // End its election session: it loses the lock, and being alone, wins it again at once.
  cluster.count("SELECT count(*) FILTER (WHERE pg_terminate_backend(holder_pid)) FROM locks");
  ASSERT_TRUE(wait_for([&] { return cluster.epoch() > epoch && cluster.leader() == "n1"; }, 20s))
      << cluster.logs();
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 4; }, 60s))
      << cluster.logs();
  const auto runs = read_runs(log);
  ASSERT_EQ(runs.size(), 4u);
  for (const auto& [job, list] : runs) {
    ASSERT_GE(list.size(), 2u) << "job " << job << " was not run again after the re-grant";
    EXPECT_TRUE(list.front().cancelled)
        << "job " << job << ": the first run did not see that its epoch ended";
    EXPECT_EQ(list.front().epoch, epoch);
    EXPECT_GT(list.back().epoch, epoch);
  }
  EXPECT_EQ(overlapping_runs(log), "");
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE outcome = 'completed'"), 4);
}

TEST(OneRun, ANodeFrozenPastItsLeaseStartsNothingWhenItWakes) {
  Cluster cluster(unique_schema("frozen_start"), 0);
  const auto log = cluster.dir() + "/runs.log";
  // A large claim buffer: the frozen node holds many jobs it has claimed and not started.
  for (const char* id : {"n1", "n2"})
    cluster.start(id, {"--run-log", log, "--threads", "2", "--batch-size", "64"});
  const auto frozen = cluster.wait_leader(20s);
  ASSERT_NE(frozen, "") << cluster.logs();
  const auto epoch = cluster.epoch();
  // Short runs: the node buffers about threads x 100 ms / run time = 40 of them.
  enqueue(cluster, "record_run", R"({"ms": 5})", 2000);
  ASSERT_TRUE(wait_for(
      [&] { return cluster.count("SELECT count(*) FROM jobs WHERE state = 'running'") >= 20; }, 20s,
      1ms))
      << cluster.logs();
  const auto stopped_at = std::chrono::system_clock::now();
  cluster.process(frozen).signal(SIGSTOP);
  // A run may still start between the signal and the moment every thread has stopped (on a busy
  // machine, milliseconds): such a run is frozen mid-way too.
  ASSERT_TRUE(cluster.process(frozen).wait_stopped(5s)) << "the leader did not stop";
  const auto all_stopped_at = std::chrono::system_clock::now();
  ASSERT_NE(cluster.wait_leader(20s, frozen), "") << cluster.logs();
  wait_for([] { return false; }, 1500ms, 100ms);  // frozen three lease lengths
  cluster.process(frozen).signal(SIGCONT);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 2000; }, 60s))
      << cluster.logs();
  // Its lease ran out at the latest one lease (0.4 s) after the freeze: nothing of its epoch
  // may be let start after that, however much it had claimed. The time a run was let start is
  // read before the lease check: a thread frozen between the check and its handler's first line
  // logs its start after the wake, but was let start before the freeze.
  const auto lease_end =
      std::chrono::duration_cast<std::chrono::microseconds>((stopped_at + 400ms).time_since_epoch())
          .count();
  std::string late;
  for (const auto& [job, list] : read_runs(log)) {
    for (const auto& r : list) {
      if (r.node != frozen || r.epoch != epoch || r.allowed_us <= lease_end) continue;
      late += "job " + std::to_string(job) + " let start " +
              std::to_string(r.allowed_us - lease_end) + " us after the lease, logged " +
              std::to_string(r.start_us - lease_end) + " us after\n";
    }
  }
  EXPECT_EQ(late, "") << "runs started by the frozen node after its lease\n"
                      << cluster.process(frozen).log();
  // A run that was frozen mid-way overlaps its rerun by nature (it cannot act while stopped);
  // any other overlap is a second start.
  const auto stopped_us =
      std::chrono::duration_cast<std::chrono::microseconds>(all_stopped_at.time_since_epoch())
          .count();
  for (const auto& [job, list] : read_runs(log)) {
    for (std::size_t i = 1; i < list.size(); ++i) {
      const auto& before = list[i - 1];
      const bool frozen_mid_run = before.node == frozen && before.allowed_us <= stopped_us;
      EXPECT_TRUE(list[i].start_us >= before.end_us || frozen_mid_run)
          << "job " << job << ": attempt " << list[i].attempt << " on " << list[i].node
          << " started while attempt " << before.attempt << " on " << before.node
          << " ran (us after every thread of " << frozen << " stopped: that run started "
          << before.start_us - stopped_us << ", ended " << before.end_us - stopped_us
          << "; this one started " << list[i].start_us - stopped_us << ")";
    }
  }
  EXPECT_EQ(cluster.count("SELECT count(DISTINCT id) FROM job_history"), 2000);
}

TEST(OneRun, AnOperatorHoldingAJobRowDoesNotStallClaims) {
  Cluster cluster(unique_schema("held_row"), 1);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  // The operator's job is due first, and its row is held, uncommitted, for the whole test:
  // locked while it is still in the future (so the node cannot have claimed it), then due.
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec(
        "INSERT INTO jobs (queue, type, payload, run_at) "
        "VALUES ('default', 'noop', '{}', now() + interval '1 second')");
  }
  const auto held = cluster.count("SELECT max(id) FROM jobs");
  auto operator_conn = connect(cluster.schema());
  pqxx::work op(*operator_conn);
  ASSERT_EQ(op.exec("SELECT id FROM jobs WHERE id = " + std::to_string(held) +
                    " AND state = 'available' FOR UPDATE")
                .size(),
            1u);
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM jobs WHERE run_at <= now() AND id = " +
                             std::to_string(held)) == 1;
      },
      5s));
  enqueue(cluster, "noop", "{}", 200);
  EXPECT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 200; }, 20s))
      << "claims stalled behind the operator's row lock\n"
      << cluster.logs();
  op.commit();
  EXPECT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 201; }, 20s))
      << cluster.logs();
}

TEST(OneRun, TheIdempotencyKeyIsTheSameForEveryRunOnEveryNodeAndEpoch) {
  Cluster cluster(unique_schema("idem_key"), 0);
  const auto log = cluster.dir() + "/runs.log";
  for (const char* id : {"n1", "n2"})
    cluster.start(id, {"--run-log", log});
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  // Half with the producer's key, half with none; long enough to be cut by the kill.
  enqueue(cluster, "record_run", R"({"ms": 3000})", 4, "order-");
  enqueue(cluster, "record_run", R"({"ms": 3000})", 4);
  ASSERT_TRUE(wait_for(
      [&] {
        auto runs = read_runs(log);
        return runs.size() == 4;
      },
      20s, 1ms))
      << cluster.logs();
  cluster.process(first).signal(SIGKILL);
  ASSERT_NE(cluster.wait_leader(20s, first), "") << cluster.logs();
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 8; }, 60s))
      << cluster.logs();
  int ran_again = 0;
  for (const auto& [job, list] : read_runs(log)) {
    const auto producer_key = query_value(
        cluster.db(), "SELECT idempotency_key FROM job_history WHERE id = " + std::to_string(job));
    const auto expected = producer_key.empty()
                              ? "baton:" + cluster.schema() + ":" + std::to_string(job)
                              : producer_key;
    std::set<long long> epochs;
    for (const auto& r : list) {
      EXPECT_EQ(r.key, expected) << "job " << job << " attempt " << r.attempt << " epoch "
                                 << r.epoch << " on " << r.node;
      epochs.insert(r.epoch);
    }
    ran_again += epochs.size() > 1;
  }
  EXPECT_GE(ran_again, 4) << "the kill should have cut the first runs, so they ran again\n"
                          << cluster.logs();
}

}  // namespace
