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
        page = scrape(addr);
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
  EXPECT_EQ(metric_sum(page, "baton_job_end_to_end_seconds_count"), 60);
  EXPECT_EQ(metric_sum(page, "baton_job_wait_seconds_count"), 60);
  EXPECT_EQ(metric_sum(page, "baton_jobs_claimed_not_started"), 0);
  EXPECT_GT(metric_sum(page, "process_resident_memory_bytes"), 1e6);
  EXPECT_GT(metric_sum(page, "process_open_fds"), 3);
  EXPECT_GT(metric_sum(page, "process_start_time_seconds"), 1.7e9);
  EXPECT_NE(page.find("\nbaton_lease_age_seconds "), std::string::npos) << "the leader reports it";
  EXPECT_LT(metric_sum(page, "baton_lease_age_seconds"), 2.0) << "renewed within the ttl";
  // Every renewal's time is observed, in seconds (on average well inside the 395 ms lease; a
  // figure in milliseconds would be far above it).
  const double renewals = metric_sum(page, "baton_lease_renewal_seconds_count");
  EXPECT_GE(renewals, 1) << page;
  EXPECT_LT(metric_sum(page, "baton_lease_renewal_seconds_sum") / renewals, 0.395) << page;
  // Every run came through a claim that found its job, and the leader claimed once more and
  // found nothing before it slept. In seconds: a claim of a few jobs on an idle server answers
  // well within 100 ms (in milliseconds, about 0.3 here, it would average above 0.1).
  const double full_claims = metric_sum(page, "baton_claim_seconds_count{result=\"jobs\"}");
  EXPECT_GE(full_claims, 1) << page;
  EXPECT_LE(full_claims, 60) << page;
  const double claim_sum = metric_sum(page, "baton_claim_seconds_sum{result=\"jobs\"}");
  EXPECT_GT(claim_sum, 0) << page;
  EXPECT_LT(claim_sum / full_claims, 0.1) << page;
  EXPECT_GE(metric_sum(page, "baton_claim_seconds_count{result=\"empty\"}"), 1) << page;
  EXPECT_EQ(page.find("job=\""), std::string::npos) << "no job ids in labels";
  EXPECT_EQ(http_get(addr, "/healthz"), "ok\n");
  EXPECT_EQ(http_get(addr, "/readyz"), "ready\n");
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

namespace {

using namespace baton::test;

// The value of one exact series line (name with its labels), or -1 when absent.
double series(const std::string& page, const std::string& name_and_labels) {
  const auto at = page.find("\n" + name_and_labels + " ");
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + name_and_labels.size() + 2));
}

TEST(Metrics, QueueDepthMatchesTheTableAndFollowersDoNotReportIt) {
  Cluster cluster(unique_schema("depth"), 2);
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  const std::string follower = leader == "n1" ? "n2" : "n1";
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("INSERT INTO queue_state (queue, paused) VALUES ('held', true)");
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'held', 'noop' FROM generate_series(1, 7)");
    tx.exec(
        "INSERT INTO jobs (queue, type, run_at) "
        "SELECT 'held', 'noop', now() + interval '1 hour' FROM generate_series(1, 3)");
    tx.exec("INSERT INTO jobs (queue, type, max_attempts) VALUES ('held2', 'fail', 1)");
  }
  ASSERT_TRUE(wait_for([&] { return !cluster.metrics_addr(leader).empty(); }, 10s));
  std::string page;
  ASSERT_TRUE(wait_for(
      [&] {
        page = scrape(cluster.metrics_addr(leader));
        return series(page, R"(baton_queue_depth{queue="held",state="available"})") == 7 &&
               series(page, R"(baton_queue_depth{queue="held",state="scheduled"})") == 3 &&
               series(page, R"(baton_dead_jobs{queue="held2"})") == 1;
      },
      20s))
      << page;
  EXPECT_GT(series(page, R"(baton_queue_oldest_available_seconds{queue="held"})"), 0) << page;
  const auto follower_page = scrape(cluster.metrics_addr(follower));
  EXPECT_EQ(follower_page.find("baton_queue_depth{"), std::string::npos)
      << "only the leader samples depth";

  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("UPDATE queue_state SET paused = false");
    tx.exec("SELECT pg_notify(current_schema() || '_jobs', 'held')");
  }
  ASSERT_TRUE(wait_for(
      [&] {
        page = scrape(cluster.metrics_addr(leader));
        return series(page, R"(baton_queue_depth{queue="held",state="available"})") == 0 &&
               series(page, R"(baton_queue_oldest_available_seconds{queue="held"})") == 0;
      },
      20s))
      << page;
  EXPECT_EQ(series(page, R"(baton_queue_depth{queue="held",state="scheduled"})"), 3);
}

}  // namespace

namespace {

using namespace baton::test;

TEST(Metrics, ANodeWithoutItsDatabaseIsAliveButNotReady) {
  const std::string dir = temp_dir("unready");
  // Port 1 on loopback: nothing listens there.
  Process node({binary("batond"), "--database-url", "postgresql://baton@127.0.0.1:1/baton",
                "--metrics-listen", "127.0.0.1:0", "--node-id", "lonely"},
               dir + "/lonely.log");
  std::string addr;
  ASSERT_TRUE(wait_for(
      [&] {
        const auto log = node.log();
        const auto at = log.find("serving metrics on http://");
        if (at == std::string::npos) return false;
        addr = log.substr(at + 26, log.find("/metrics", at) - at - 26);
        return true;
      },
      10s))
      << node.log();
  EXPECT_EQ(http_get(addr, "/healthz"), "ok\n");
  EXPECT_EQ(http_get(addr, "/readyz"), "") << "503 is not a 200";
  std::string out;
  run_command("curl -s -o /dev/null -w '%{http_code}' http://" + addr + "/readyz", &out);
  EXPECT_EQ(out, "503");
  EXPECT_TRUE(
      wait_for([&] { return node.log().find("database unreachable") != std::string::npos; }, 10s))
      << node.log();
  EXPECT_TRUE(node.running()) << "an unreachable database is not fatal";
}

}  // namespace
