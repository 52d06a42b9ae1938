// What a newcomer's first hour met, each pinned with real processes: two lock groups in one
// schema, a rolling deploy that adds a job type, cancel and status from batonctl, nodes that
// follow the lease, the deployment label, and configuration mistakes that say what and where.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/cluster.h"

namespace {

using namespace baton::test;

TEST(Newcomer, TwoLockGroupsInOneSchemaEachFinishTheirOwnJobsOnce) {
  Cluster cluster(unique_schema("two_groups"), 0);
  // Group A's epochs are far ahead of group B's: comparing them across groups would rescue B's
  // running jobs on every pass of A's rescuer.
  cluster.count(
      "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
      "VALUES ('A', 'default', 'old', 40, now())");
  for (const char* id : {"a1", "a2"})
    cluster.start(id, {"--lock-key", "A", "--queues", "qa"});
  for (const char* id : {"b1", "b2"})
    cluster.start(id, {"--lock-key", "B", "--queues", "qb"});
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count(
                   "SELECT count(*) FROM locks "
                   "WHERE expires_at > clock_timestamp()") == 2;
      },
      20s))
      << cluster.logs();
  cluster.count(
      "SELECT enqueue_many((SELECT jsonb_agg(jsonb_build_object('type', 'sleep', "
      "'queue', 'qb', 'payload', jsonb_build_object('ms', 3000), 'max_attempts', 3)) "
      "FROM generate_series(1, 4)))");
  cluster.count("SELECT enqueue('qa', 'noop')");
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 5; }, 40s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT max(attempts) FROM job_history"), 1)
      << "a job ran more than once: " << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE queue = 'qb' AND node LIKE 'b%'"),
            4);
  EXPECT_EQ(cluster.logs().find("FENCED"), std::string::npos) << cluster.logs();
}

TEST(Newcomer, AJobTypeTheLeaderCannotRunWaitsVisiblyUntilALeaderThatCanTakesOver) {
  Cluster cluster(unique_schema("rolling"), 0);
  // The old version: a node without the job's handler.
  cluster.start("old", {}, "batond");
  ASSERT_EQ(cluster.wait_leader(20s), "old") << cluster.logs();
  const auto id = cluster.count("SELECT enqueue('default', 'noop')");
  // Visible: the metric (sampled every 5 s) and batonctl stats.
  ASSERT_TRUE(wait_for(
      [&] {
        return metric_sum(http_get(cluster.metrics_addr("old"), "/metrics"),
                          "baton_jobs_without_handler") == 1;
      },
      15s))
      << http_get(cluster.metrics_addr("old"), "/metrics");
  const auto stats = nlohmann::json::parse(ctl(cluster, "--json stats"));
  EXPECT_EQ(stats[0]["without_handler"], 1) << stats.dump();
  EXPECT_EQ(cluster.count("SELECT attempts FROM jobs WHERE id = " + std::to_string(id)), 0);
  // The new version joins, the old one leaves: the job runs, once.
  cluster.start("new");
  cluster.process("old").signal(SIGTERM);
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count(
                   "SELECT count(*) FROM job_history WHERE attempts = 1 AND node = 'new'") == 1;
      },
      20s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs"), 0);
}

TEST(Newcomer, ACancelledJobStopsRunningAndItsStatusSaysSo) {
  Cluster cluster(unique_schema("cancel"), 1);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  cluster.count(
      "SELECT enqueue('default', 'sleep', '{\"ms\": 60000}', idempotency_key => 'long-one')");
  const auto later =
      cluster.count("SELECT enqueue('default', 'noop', run_at => now() + interval '1 hour')");
  ASSERT_TRUE(wait_for(
      [&] { return cluster.count("SELECT count(*) FROM jobs WHERE state = 'running'") == 1; },
      20s));
  int rc = -1;
  auto out = ctl(cluster, "jobs show --key long-one", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("running"), std::string::npos) << out;
  out = ctl(cluster, "--json jobs cancel --key long-one", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["result"], "cancelling") << out;
  // The handler sees ctx.cancelled() and stops; the job ends in history as cancelled.
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count(
                   "SELECT count(*) FROM job_history WHERE outcome = 'cancelled' "
                   "AND idempotency_key = 'long-one'") == 1;
      },
      10s))
      << cluster.logs();
  out = ctl(cluster, "--json jobs cancel " + std::to_string(later), &rc);
  EXPECT_EQ(nlohmann::json::parse(out)["result"], "cancelled") << out;
  out = ctl(cluster, "jobs show " + std::to_string(later), &rc);
  EXPECT_NE(out.find("cancelled"), std::string::npos) << out;
  out = ctl(cluster, "jobs cancel 424242", &rc);
  EXPECT_EQ(rc, 1) << out;
}

TEST(Newcomer, NodesShowTheLeaseAndLastSeenNotWhatADeadNodeLastWrote) {
  Cluster cluster(unique_schema("nodes_live"), 2);
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  cluster.process(first).signal(SIGKILL);
  const auto second = cluster.wait_leader(20s, first);
  ASSERT_NE(second, "") << cluster.logs();
  ASSERT_TRUE(wait_for(
      [&] {
        const auto nodes = nlohmann::json::parse(ctl(cluster, "--json nodes"));
        bool dead_ok = false, leader_ok = false;
        for (const auto& n : nodes) {
          if (n["node_id"] == first) dead_ok = n["status"] == "dead" && n["role"] == "-";
          if (n["node_id"] == second) leader_ok = n["role"] == "leader" && n["status"] == "live";
        }
        return dead_ok && leader_ok;
      },
      15s))
      << ctl(cluster, "nodes");
  // A paused queue shows in stats even with no jobs; pausing an unknown queue warns.
  int rc = -1;
  auto out = ctl(cluster, "queue pause never-seen", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("warning: queue never-seen has no jobs"), std::string::npos) << out;
  const auto stats = nlohmann::json::parse(ctl(cluster, "--json stats"));
  ASSERT_EQ(stats.size(), 1u) << stats.dump();
  EXPECT_EQ(stats[0]["queue"], "never-seen");
  EXPECT_EQ(stats[0]["paused"], true);
}

TEST(Newcomer, EveryMetricNamesItsDeployment) {
  const auto schema = unique_schema("deployment");
  Cluster cluster(schema, 1, {"--cluster", "prod"});
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto page = http_get(cluster.metrics_addr("n1"), "/metrics");
  std::istringstream lines(page);
  int samples = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    ++samples;
    EXPECT_NE(line.find("deployment=\"prod/" + schema + "\""), std::string::npos) << line;
  }
  EXPECT_GT(samples, 20);
}

TEST(Newcomer, ConfigurationMistakesSayWhatWhereAndWhatToDo) {
  const std::string dir = temp_dir("config_mistakes");
  std::string out;
  const std::string batond = binary("batond") + " --database-url '" + database_url() + "' ";
  EXPECT_EQ(run_command(batond + "--config " + dir + "/missing.toml --print-config", &out), 2);
  EXPECT_NE(out.find("cannot read " + dir + "/missing.toml"), std::string::npos) << out;
  std::ofstream(dir + "/fractional.toml") << "threads = 4.5\n";
  EXPECT_EQ(run_command(batond + "--config " + dir + "/fractional.toml --print-config", &out), 2);
  EXPECT_NE(out.find("threads: '4.5' is not a whole number (from " + dir +
                     "/fractional.toml, key threads)"),
            std::string::npos)
      << out;
  // --print-config does not pin this process's id into a file made from it.
  EXPECT_EQ(run_command(batond + "--print-config", &out), 0) << out;
  EXPECT_NE(out.find("node-id = \"\""), std::string::npos) << out;
  // A metrics port in use: which port, and what to do.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const auto taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  EXPECT_EQ(run_command(batond + "--metrics-listen " + taken + " --schema x_unused", &out), 1)
      << out;
  EXPECT_NE(out.find("cannot serve on " + taken), std::string::npos) << out;
  EXPECT_NE(out.find("choose a free host:port"), std::string::npos) << out;
  close(fd);
}

}  // namespace
