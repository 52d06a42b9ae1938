// /metrics over real HTTP from a real batond: valid for promtool, and counting what happened.
#include <gtest/gtest.h>

#include <fstream>

#include "support/cluster.h"

namespace {

using namespace baton::test;

TEST(Metrics, ScrapePassesPromtoolAndCountsEveryJob) {
  Cluster cluster(unique_schema("metrics"), 1);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'mq', 'noop' FROM generate_series(1, 50)");
    tx.exec(
        "INSERT INTO jobs (queue, type, max_attempts) "
        "SELECT 'mq', 'fail', 2 FROM generate_series(1, 5)");
  }
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM job_history") == 50 &&
               cluster.count("SELECT count(*) FROM dead_jobs") == 5;
      },
      30s))
      << cluster.logs();

  const auto addr = cluster.metrics_addr("n1");
  ASSERT_NE(addr, "");
  std::string page;
  // Counters are bumped when handlers finish; wait until the page shows all 60 runs.
  ASSERT_TRUE(wait_for(
      [&] {
        page = http_get(addr, "/metrics");
        return metric_sum(page, "baton_job_run_seconds_count") == 60;
      },
      10s))
      << page;

  EXPECT_EQ(metric_sum(page, "baton_jobs_completed_total"), 50);
  EXPECT_EQ(metric_sum(page, "baton_jobs_retried_total"), 5);
  EXPECT_EQ(metric_sum(page, "baton_jobs_dead_total"), 5);
  EXPECT_EQ(metric_sum(page, "baton_jobs_started_total"), 60);
  EXPECT_EQ(metric_sum(page, "baton_leader"), 1);
  EXPECT_EQ(metric_sum(page, "baton_leader_epoch"), 1);
  EXPECT_EQ(metric_sum(page, "baton_pool_threads"), 4);
  EXPECT_NE(page.find("baton_jobs_completed_total{queue=\"mq\",type=\"noop\"} 50"),
            std::string::npos)
      << page;

  const std::string file = cluster.dir() + "/metrics.txt";
  std::ofstream(file) << page;
  std::string out;
  const int rc = run_command("promtool check metrics < " + file, &out);
  EXPECT_EQ(rc, 0) << "promtool check metrics failed:\n" << out;
}

}  // namespace
