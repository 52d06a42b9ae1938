// Real batond processes: one leader among many; kill -9 and SIGTERM of the leader hand over to
// another node and every job still ends in history exactly once.
#include <gtest/gtest.h>

#include <csignal>

#include "support/cluster.h"
#include "support/runs.h"

namespace {

using namespace baton::test;

TEST(Failover, ThreeNodesElectExactlyOneLeader) {
  Cluster cluster(unique_schema("one_leader"), 3);
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  EXPECT_EQ(cluster.epoch(), 1) << "first election, no churn";
  // Every node reports whether it leads: exactly one says yes.
  ASSERT_TRUE(wait_for(
      [&] {
        for (const auto& id : cluster.node_ids()) {
          if (cluster.metrics_addr(id).empty()) return false;
        }
        return true;
      },
      20s))
      << "nodes did not all register their metrics address";
  ASSERT_TRUE(wait_for(
      [&] {
        double leaders = 0;
        for (const auto& id : cluster.node_ids()) {
          const auto page = http_get(cluster.metrics_addr(id), "/metrics");
          if (page.empty()) return false;
          leaders += metric_sum(page, "baton_leader");
        }
        return leaders == 1;
      },
      10s))
      << "sum(baton_leader) over the cluster never settled at 1\n"
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM nodes WHERE role = 'leader'"), 1);
}

TEST(Failover, KillNineOfTheLeaderMidRunLosesNoJob) {
  Cluster cluster(unique_schema("kill9"), 3);
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  constexpr int kJobs = 400;
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec_params(
        "INSERT INTO jobs (queue, type, payload) SELECT 'default', 'sleep', '{\"ms\": 20}' "
        "FROM generate_series(1, $1)",
        kJobs);
  }
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") >= 40; }, 30s))
      << "the leader did not start processing\n"
      << cluster.logs();
  const auto old_epoch = cluster.epoch();
  cluster.process(first).signal(SIGKILL);
  EXPECT_EQ(cluster.process(first).wait(5s), 128 + SIGKILL);

  const auto second = cluster.wait_leader(20s, first);
  ASSERT_NE(second, "") << "no node took over\n" << cluster.logs();
  EXPECT_GT(cluster.epoch(), old_epoch) << "a new leader has a newer epoch";

  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == kJobs; }, 60s))
      << "history has " << cluster.count("SELECT count(*) FROM job_history") << " of " << kJobs
      << "\n"
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs"), 0);
  EXPECT_GT(cluster.count("SELECT count(*) FROM job_history WHERE node = '" + second + "'"), 0)
      << "the new leader finished the rest";
}

TEST(Failover, SigtermOfTheLeaderHandsOverAndExitsZero) {
  Cluster cluster(unique_schema("sigterm"), 0);
  const auto log = cluster.dir() + "/runs.log";
  for (const char* id : {"n1", "n2"})
    cluster.start(id, {"--run-log", log});
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec(
        "INSERT INTO jobs (queue, type, payload) SELECT 'default', 'record_run', "
        "'{\"ms\": 300}' FROM generate_series(1, 4)");
  }
  // Running, not only claimed: a claimed job that has not started when the shutdown begins goes
  // back to the queue (and runs on the next leader), which this test is not about.
  ASSERT_TRUE(wait_for([&] { return read_runs(log).size() == 4; }, 20s)) << cluster.logs();
  const auto t0 = std::chrono::steady_clock::now();
  cluster.process(first).signal(SIGTERM);
  const auto second = cluster.wait_leader(20s, first, Cluster::Held::granted);
  const auto handoff = std::chrono::steady_clock::now() - t0;
  ASSERT_NE(second, "") << cluster.logs();
  EXPECT_EQ(cluster.process(first).wait(15s), 0) << cluster.logs();
  // The in-flight jobs finished on the old leader before it stepped down: none ran twice.
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE node = '" + first + "'"), 4);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
  for (const auto& [job, list] : read_runs(log)) {
    ASSERT_EQ(list.size(), 1u) << "job " << job << " ran " << list.size() << " times";
    EXPECT_EQ(list.front().node, first) << "job " << job;
    EXPECT_FALSE(list.front().cancelled) << "job " << job << " was cut short by the shutdown";
  }
  std::printf(
      "[ info ] SIGTERM handoff (signal to new leader's lease, incl. 300 ms drain): %.1f ms\n",
      std::chrono::duration<double, std::milli>(handoff).count());
}

}  // namespace
