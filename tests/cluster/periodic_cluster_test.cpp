// Periodic jobs on a real cluster: a kill -9 of the leader between ticks loses none and
// duplicates none; batonctl shows the schedules; a bad schedule stops batond at startup.
#include <gtest/gtest.h>

#include <csignal>

#include "support/cluster.h"

namespace {

using namespace baton::test;

std::vector<long long> ticks(Cluster& cluster) {
  std::vector<long long> out;
  pqxx::nontransaction tx(cluster.db());
  for (const auto& r : tx.exec("SELECT extract(epoch FROM run_at)::bigint FROM (SELECT run_at "
                               "FROM jobs WHERE type = 'noop' UNION ALL SELECT run_at FROM "
                               "job_history WHERE type = 'noop') t ORDER BY 1")) {
    out.push_back(r[0].as<long long>());
  }
  return out;
}

TEST(PeriodicCluster, AKilledLeaderLosesNoTickAndNoTickRunsTwice) {
  Cluster cluster(unique_schema("periodic_kill"), 3, {"--schedule", "tick:noop=every 1s"});
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  ASSERT_TRUE(wait_for([&] { return ticks(cluster).size() >= 3; }, 30s)) << cluster.logs();
  cluster.process(first).signal(SIGKILL);
  ASSERT_NE(cluster.wait_leader(20s, first), "") << cluster.logs();
  const auto at_kill = ticks(cluster).size();
  ASSERT_TRUE(wait_for([&] { return ticks(cluster).size() >= at_kill + 4; }, 30s))
      << cluster.logs();
  const auto t = ticks(cluster);
  for (std::size_t i = 1; i < t.size(); ++i) {
    EXPECT_EQ(t[i] - t[i - 1], 1) << "tick " << i << ": a gap or a duplicate\n" << cluster.logs();
  }

  std::string out;
  ASSERT_EQ(run_command(binary("batonctl") + " --database-url '" + database_url() + "' --schema " +
                            cluster.schema() + " schedules",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("tick"), std::string::npos) << out;
  EXPECT_NE(out.find("every 1s"), std::string::npos) << out;
  EXPECT_NE(out.find("completed"), std::string::npos) << "the last run's outcome: " << out;

  const auto page = scrape(cluster.metrics_addr(cluster.leader()));
  EXPECT_GT(metric_sum(page, "baton_schedule_ticks_total"), 0) << page;
  EXPECT_NE(page.find("baton_schedule_lag_seconds{schedule=\"tick\"}"), std::string::npos) << page;
}

TEST(PeriodicCluster, AnInvalidScheduleStopsBatondWithThePosition) {
  std::string out;
  const int rc = run_command(binary("batond") + " --database-url '" + database_url() +
                                 "' --schedule 'report=0 25 * * *' --print-config",
                             &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("25 is out of range in the hour field at position 3"), std::string::npos)
      << out;
}

}  // namespace
