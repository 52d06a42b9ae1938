// Network partitions between nodes and PostgreSQL, with a blackholing proxy in front of each
// node (packets vanish: nothing is closed), and what must hold through them: the old leader
// demotes itself before anyone else is granted, no job runs twice at once or commits twice,
// nothing is lost, and a node cut off still stops, reports and exits on time.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <regex>

#include "support/cluster.h"
#include "support/proxy.h"
#include "support/runs.h"

namespace {

using namespace baton::test;
using Clock = std::chrono::system_clock;

// Every node reaches PostgreSQL through a proxy of its own.
struct ProxiedCluster {
  ProxiedCluster(const std::string& schema, int nodes, std::vector<std::string> extra = {})
      : cluster(schema, 0, std::move(extra)), run_log(cluster.dir() + "/runs.log") {
    for (int i = 1; i <= nodes; ++i) {
      const std::string id = std::string("n").append(std::to_string(i));  // (see poller.cpp)
      proxies.emplace(id, std::make_unique<Proxy>(database_url()));
      cluster.start(id, {"--database-url", proxies.at(id)->url_through(database_url()), "--run-log",
                         run_log});
    }
    create_effects(cluster);
  }
  Proxy& proxy(const std::string& id) { return *proxies.at(id); }
  void enqueue(const std::string& type, const std::string& payload, int n) {
    baton::test::enqueue(cluster, type, payload, n);
  }

  Cluster cluster;
  std::string run_log;
  std::map<std::string, std::unique_ptr<Proxy>> proxies;
};

// Every job finished exactly once, and every transactional effect is the one of its completion.
void expect_each_job_once(Cluster& cluster, long long jobs) {
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history"), jobs) << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(DISTINCT id) FROM job_history"), jobs);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs"), 0);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM effects e JOIN job_history h ON h.id = e.job_id "
                          "WHERE e.epoch <> h.epoch"),
            0)
      << "an effect of a run that did not complete the job was committed";
  EXPECT_EQ(cluster.count("SELECT count(*) - count(DISTINCT job_id) FROM effects"), 0)
      << "a transactional effect was committed twice";
}

// Waits (20 s at most) until `node` is a live follower again, as it must be after a heal.
bool rejoins_as_follower(Cluster& cluster, const std::string& node) {
  return wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM nodes WHERE node_id = '" + node +
                             "' AND role = 'follower' AND last_seen > now() - interval '1 s'") == 1;
      },
      20s);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

long long metric(const std::string& page, const std::string& name) {
  return static_cast<long long>(metric_sum(page, name));
}

TEST(Partition, TheLeadersDemotionAlwaysPrecedesTheNextGrant) {
  ProxiedCluster pc(unique_schema("part_leader"), 3);
  auto& cluster = pc.cluster;
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  // A steady load through every round: plain runs that log their intervals, and transactional
  // effects that must commit once.
  constexpr int kRuns = 4000, kTx = 1000;
  pc.enqueue("record_run", R"({"ms": 20})", kRuns);
  pc.enqueue("record_tx", R"({"ms": 20})", kTx);

  constexpr int kRounds = 10;
  std::vector<double> demoted_ms, granted_ms, first_job_ms;
  for (int round = 1; round <= kRounds; ++round) {
    const auto leader = cluster.wait_leader(20s);
    ASSERT_NE(leader, "") << "round " << round << "\n" << cluster.logs();
    const auto epoch = cluster.epoch();
    // Wait until the leader is at work under this epoch, so the cut lands mid-run.
    ASSERT_TRUE(wait_for(
        [&] {
          return cluster.count(
                     "SELECT count(*) FROM jobs WHERE state = 'running' AND "
                     "claimed_epoch = " +
                     std::to_string(epoch)) > 0 ||
                 cluster.count("SELECT count(*) FROM jobs") == 0;
        },
        20s, 2ms))
        << cluster.logs();
    const auto cut = Clock::now();
    pc.proxy(leader).blackhole();
    const auto next = cluster.wait_leader(20s, leader);
    ASSERT_NE(next, "") << "round " << round << ": no node replaced the partitioned leader\n"
                        << cluster.logs();
    const auto new_epoch = cluster.epoch();
    ASSERT_TRUE(wait_for(
        [&] {
          return logged_at(cluster.process(leader).log(),
                           "leadership LOST: epoch=" + std::to_string(epoch), cut)
              .has_value();
        },
        10s))
        << "round " << round << ": the partitioned leader never demoted itself\n"
        << cluster.process(leader).log();
    const auto demoted = *logged_at(cluster.process(leader).log(),
                                    "leadership LOST: epoch=" + std::to_string(epoch), cut);
    ASSERT_TRUE(wait_for(
        [&] {
          return logged_at(cluster.process(next).log(),
                           "leadership GRANTED: epoch=" + std::to_string(new_epoch), cut)
              .has_value();
        },
        10s))
        << cluster.process(next).log();
    const auto granted = *logged_at(cluster.process(next).log(),
                                    "leadership GRANTED: epoch=" + std::to_string(new_epoch), cut);
    demoted_ms.push_back(ms_between(cut, demoted));
    granted_ms.push_back(ms_between(cut, granted));
    // Demotion strictly first: the log's millisecond cannot order two events in one millisecond.
    EXPECT_LT(demoted, granted) << "round " << round << ": " << leader << " demoted at +"
                                << demoted_ms.back() << " ms, " << next << " granted at +"
                                << granted_ms.back() << " ms";
    // The new epoch gets to work.
    ASSERT_TRUE(wait_for(
        [&] {
          return cluster.count("SELECT count(*) FROM job_history WHERE epoch = " +
                               std::to_string(new_epoch)) > 0 ||
                 cluster.count("SELECT count(*) FROM jobs") == 0;
        },
        20s, 2ms))
        << cluster.logs();
    const auto first =
        query_value(cluster.db(),
                    "SELECT (extract(epoch FROM min(started_at)) * 1000000)::bigint::text "
                    "FROM job_history WHERE epoch = " +
                        std::to_string(new_epoch));
    if (!first.empty()) {
      first_job_ms.push_back(
          ms_between(cut, Clock::time_point(std::chrono::microseconds(std::stoll(first)))));
    }
    // Heal: the old leader comes back as a follower.
    pc.proxy(leader).heal();
    ASSERT_TRUE(rejoins_as_follower(cluster, leader))
        << "round " << round << ": the healed node did not rejoin as a follower\n"
        << cluster.process(leader).log();
    EXPECT_EQ(cluster.leader(), next) << "the healed node took leadership back";
  }
  auto print = [](const char* what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    if (!v.empty()) {
      std::printf("[ info ] partition to %s: p50 %.0f ms, max %.0f ms (%zu rounds)\n", what,
                  v[v.size() / 2], v.back(), v.size());
    }
  };
  print("the old leader's demotion", demoted_ms);
  print("the next grant", granted_ms);
  print("the next epoch's first job", first_job_ms);

  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM jobs") == 0; }, 120s))
      << cluster.logs();
  expect_each_job_once(cluster, kRuns + kTx);
  EXPECT_EQ(overlapping_runs(pc.run_log), "");
  // The nodes that were cut off refused their late outcomes rather than applying them.
  long long fenced = 0;
  for (const auto& id : cluster.node_ids())
    fenced += metric(scrape(cluster.metrics_addr(id)), "baton_fenced_total");
  std::printf("[ info ] late outcomes fenced across %d partitions: %lld\n", kRounds, fenced);
}

TEST(Partition, AFollowerCutOffChangesNothing) {
  ProxiedCluster pc(unique_schema("part_follower"), 2);
  auto& cluster = pc.cluster;
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  const std::string follower = leader == "n1" ? "n2" : "n1";
  const auto epoch = cluster.epoch();
  pc.enqueue("record_run", R"({"ms": 5})", 1000);
  pc.proxy(follower).blackhole();
  // Its readiness goes, its leadership never came: the cluster goes on as before.
  ASSERT_TRUE(
      wait_for([&] { return http_get(cluster.metrics_addr(follower), "/readyz").empty(); }, 10s))
      << "the cut-off follower still says it is ready\n"
      << cluster.process(follower).log();
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM jobs") == 0; }, 60s))
      << cluster.logs();
  EXPECT_EQ(cluster.epoch(), epoch);
  EXPECT_EQ(cluster.leader(), leader);
  pc.proxy(follower).heal();
  EXPECT_TRUE(wait_for(
      [&] { return http_get(cluster.metrics_addr(follower), "/readyz") == "ready\n"; }, 20s))
      << cluster.process(follower).log();
  EXPECT_EQ(cluster.epoch(), epoch) << "the healed follower disturbed the leader";
  expect_each_job_once(cluster, 1000);
  EXPECT_EQ(overlapping_runs(pc.run_log), "");
}

TEST(Partition, DuringCommitsLosesNothingAndCommitsNothingTwice) {
  ProxiedCluster pc(unique_schema("part_commit"), 2);
  auto& cluster = pc.cluster;
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  // Short transactional jobs: commits are in flight nearly all the time.
  constexpr int kJobs = 3000;
  pc.enqueue("record_tx", R"({"ms": 1})", kJobs);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") >= 300; }, 30s, 1ms))
      << cluster.logs();
  pc.proxy(leader).blackhole();
  ASSERT_NE(cluster.wait_leader(20s, leader), "") << cluster.logs();
  // The new leader finishes the work while the old one is still cut off...
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM jobs") == 0; }, 90s))
      << cluster.logs();
  // ...then the held bytes (commits among them) reach the server.
  pc.proxy(leader).heal();
  ASSERT_TRUE(rejoins_as_follower(cluster, leader)) << cluster.process(leader).log();
  expect_each_job_once(cluster, kJobs);
}

TEST(Partition, ABlackholedLeaderStopsReportsAndExitsWithinTheGrace) {
  ProxiedCluster pc(unique_schema("part_long"), 2, {"--shutdown-grace", "3s"});
  auto& cluster = pc.cluster;
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  const auto epoch = cluster.epoch();
  const auto addr = cluster.metrics_addr(leader);
  ASSERT_EQ(http_get(addr, "/readyz"), "ready\n");
  // Work that is mid-run and mid-commit when the network goes.
  pc.enqueue("record_run", R"({"ms": 200})", 400);
  pc.enqueue("record_tx", R"({"ms": 50})", 400);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") >= 20; }, 30s, 1ms))
      << cluster.logs();
  const auto cut = Clock::now();
  pc.proxy(leader).blackhole();

  // Within the lease: it stops consuming, says it does not lead, and says it is not ready; its
  // metrics port still answers.
  const std::string stopped = "stopped consuming: epoch=" + std::to_string(epoch);
  ASSERT_TRUE(wait_for(
      [&] { return logged_at(cluster.process(leader).log(), stopped, cut).has_value(); }, 5s))
      << "consumption did not stop while the network was gone\n"
      << cluster.process(leader).log();
  std::printf("[ info ] blackhole to stopped consuming: %.0f ms\n",
              ms_between(cut, *logged_at(cluster.process(leader).log(), stopped, cut)));
  // It says why: its lease ran out waiting for a database that did not answer, so more of the
  // lease went waiting for the database than to the node itself. Its pauses between renewals,
  // which every lease spans by design, are counted apart: counted as the node's, a blackhole
  // under load once read 197 ms of waiting against 198 ms of "this process", 100 ms of it pause.
  {
    const auto log = cluster.process(leader).log();
    const std::regex lost("leadership LOST: epoch=" + std::to_string(epoch) +
                          " reason=lost_renewal: no renewal came back within [0-9]+ ms; of the "
                          "[0-9]+ ms [^,]*, ([0-9]+) ms went waiting for the database, [0-9]+ ms "
                          "to its pauses between renewals and ([0-9]+) ms to this process[^\n]*: "
                          "the database, or the network to it, answered too slowly");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, lost)) << log;
    EXPECT_GE(std::stoi(m[1]), std::stoi(m[2])) << m[0];
  }
  EXPECT_TRUE(wait_for(
      [&] { return metric(scrape(addr), "baton_leader") == 0 && !scrape(addr).empty(); }, 5s))
      << scrape(addr);
  EXPECT_TRUE(wait_for([&] { return http_get(addr, "/readyz").empty(); }, 5s))
      << "/readyz still says ready while the database is out of reach";
  EXPECT_NE(cluster.wait_leader(20s, leader), "") << cluster.logs();

  // Deep inside a long blackhole (30 s), SIGTERM still ends the process within the grace.
  wait_for([] { return false; }, 10s, 500ms);
  ASSERT_TRUE(pc.proxy(leader).blackholed());
  const auto term = std::chrono::steady_clock::now();
  cluster.process(leader).signal(SIGTERM);
  const bool exited =
      wait_for([&] { return !cluster.process(leader).running(); }, 4s + 1s + 2s, 10ms);
  const double exit_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - term).count();
  ASSERT_TRUE(exited) << "SIGTERM did not end a node whose network is gone\n"
                      << cluster.process(leader).log();
  std::printf("[ info ] SIGTERM to exit inside a blackhole: %.0f ms (grace 3000 ms)\n", exit_ms);
  EXPECT_LE(exit_ms, 3000 + 1000) << cluster.process(leader).log();

  // The rest of the 30 s pass; then the held bytes arrive at a server whose sessions are gone.
  wait_for([&] { return Clock::now() - cut >= 30s; }, 30s, 500ms);
  pc.proxy(leader).heal();
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM jobs") == 0; }, 60s))
      << cluster.logs();
  expect_each_job_once(cluster, 800);
  EXPECT_EQ(overlapping_runs(pc.run_log), "");
}

TEST(Partition, TheLeaderCutFromPostgresButNotFromItsPeersSaysSoOnItsPort) {
  // The peers (and Prometheus) still reach the cut-off leader's port; what it reports there
  // must agree with the database's view: not the leader, not ready.
  ProxiedCluster pc(unique_schema("part_half"), 2);
  auto& cluster = pc.cluster;
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  const std::string other = leader == "n1" ? "n2" : "n1";
  pc.proxy(leader).blackhole();
  ASSERT_EQ(cluster.wait_leader(20s, leader), other) << cluster.logs();
  const auto a = scrape(cluster.metrics_addr(leader));
  const auto b = scrape(cluster.metrics_addr(other));
  EXPECT_EQ(metric(a, "baton_leader"), 0) << a;
  EXPECT_EQ(metric(b, "baton_leader"), 1) << b;
  // Not ready once nothing has answered it for its reachability window (the larger of 1 s and
  // the lock ttl).
  EXPECT_TRUE(
      wait_for([&] { return http_get(cluster.metrics_addr(leader), "/readyz").empty(); }, 3s));
  EXPECT_EQ(http_get(cluster.metrics_addr(other), "/readyz"), "ready\n");
  pc.proxy(leader).heal();
}

}  // namespace
