// Election under faults, with real batond processes: many nodes at once, a frozen leader, a
// terminated election session, a requested step-down, and settings refused at startup.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <sstream>

#include "baton/detail/db.h"
#include "support/cluster.h"

namespace {

using namespace baton::test;

// CPU seconds (user + system) a process has used so far.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

TEST(Election, FiveNodesAtOnceOneLeaderAndEpochsOnlyIncrease) {
  Cluster cluster(unique_schema("five"), 5);
  auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  EXPECT_EQ(cluster.epoch(), 1);
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM nodes") == 5; }, 20s));
  EXPECT_EQ(cluster.count("SELECT count(*) FROM nodes WHERE role = 'leader'"), 1);

  // Kill three leaders in a row, sampling the epoch all along: it never goes back.
  long long last = 0;
  bool monotonic = true;
  for (int round = 0; round < 3; ++round) {
    cluster.process(leader).signal(SIGKILL);
    cluster.process(leader).wait(5s);
    std::string next;
    ASSERT_TRUE(wait_for(
        [&] {
          const auto e = cluster.epoch();
          monotonic = monotonic && e >= last;
          last = e;
          next = cluster.leader();
          return !next.empty() && next != leader;
        },
        20s, 2ms))
        << "no new leader after killing " << leader << "\n"
        << cluster.logs();
    leader = next;
  }
  EXPECT_TRUE(monotonic) << "the epoch went backwards";
  EXPECT_EQ(cluster.epoch(), 4) << "one grant per failover, no churn";
}

TEST(Election, AFrozenLeaderIsReplacedAndNeverCommitsTwice) {
  Cluster cluster(unique_schema("sigstop"), 3);
  create_effects(cluster);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  // Long handlers, so that all four are surely inside their transactions when it freezes.
  constexpr int kJobs = 8;
  enqueue(cluster, "record_tx", R"({"ms": 1500, "ignore_cancel": true})", kJobs);
  // Freeze the node whose four handlers sit inside their transactions, effects written,
  // uncommitted: the leader that runs the jobs. (The first leader may lose a slow first renewal
  // at start-up and hand over, so the node named before the jobs ran need not be the one.)
  std::string frozen;
  ASSERT_TRUE(wait_for(
      [&] {
        pqxx::nontransaction tx(cluster.db());
        const auto r = tx.exec_params(
            "SELECT split_part(application_name, '@', 1) FROM pg_stat_activity "
            "WHERE split_part(application_name, '@', 2) = $1 AND state = 'idle in transaction' "
            "AND query LIKE 'INSERT INTO effects%' GROUP BY 1 HAVING count(*) = 4",
            cluster.schema());
        if (r.empty()) return false;
        frozen = r[0][0].c_str();
        return true;
      },
      20s, 1ms))
      << cluster.logs();

  const auto stopped_at = std::chrono::steady_clock::now();
  cluster.process(frozen).signal(SIGSTOP);
  const auto next = cluster.wait_leader(20s, frozen, Cluster::Held::granted);
  ASSERT_NE(next, "") << "no node replaced the frozen leader\n" << cluster.logs();
  std::printf(
      "[ info ] SIGSTOP to new leader: %.0f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stopped_at)
          .count());
  // The new leader ends the frozen leader's open transactions (and their row locks) at once,
  // while it is still frozen.
  EXPECT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" +
                             frozen + "@" + cluster.schema() + "' AND xact_start IS NOT NULL") == 0;
      },
      5s))
      << cluster.process(next).log();
  // Stay frozen well past the ttl (0.5 s) so that every timer of the old leader has run out.
  wait_for([] { return false; }, 2500ms, 100ms);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == kJobs; }, 60s))
      << cluster.logs();
  cluster.process(frozen).signal(SIGCONT);
  ASSERT_TRUE(wait_for(
      [&] { return cluster.process(frozen).log().find("leadership LOST") != std::string::npos; },
      20s))
      << "the thawed leader did not revoke itself\n"
      << cluster.process(frozen).log();
  // It says why: not the database, but its own stop (its watchdog woke long after the lease).
  {
    const auto log = cluster.process(frozen).log();
    const auto lost = log.find("reason=lost_renewal: no renewal came back");
    ASSERT_NE(lost, std::string::npos) << log;
    const auto line = log.substr(lost, log.find('\n', lost) - lost);
    EXPECT_NE(line.find("this process did not run for a while"), std::string::npos) << line;
  }

  // Work enqueued after the thaw runs on the new leader only.
  enqueue(cluster, "record_tx", R"({"ms": 0})", 20);
  ASSERT_TRUE(wait_for(
      [&] { return cluster.count("SELECT count(*) FROM job_history") == kJobs + 20; }, 30s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM effects"), kJobs + 20)
      << "a transactional effect was committed twice (or lost)";
  EXPECT_EQ(cluster.count("SELECT count(DISTINCT job_id) FROM effects"), kJobs + 20);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM effects e JOIN job_history h ON h.id = e.job_id "
                          "WHERE e.epoch <> h.epoch"),
            0)
      << "every effect comes from the epoch that completed the job";
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE node = '" + frozen +
                          "' AND first_started_at > (SELECT created_date FROM locks)"),
            0)
      << "the thawed leader claimed work after it was deposed";
  EXPECT_TRUE(cluster.process(frozen).running()) << "the thawed node should live on as follower";

  // The thawed node's late outcomes were refused, and it counts them by queue and type.
  std::string page;
  EXPECT_TRUE(wait_for(
      [&] {
        page = scrape(cluster.metrics_addr(frozen));
        return page.find(R"(baton_fenced_total{queue="default",type="record_tx"})") !=
               std::string::npos;
      },
      10s))
      << page << cluster.process(frozen).log();
  EXPECT_GE(metric_sum(page, "baton_fenced_total"), 1) << page;
}

TEST(Election, TerminatingTheElectionSessionRevokesAndReelects) {
  Cluster cluster(unique_schema("terminate"), 2);
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  const auto epoch = cluster.epoch();
  cluster.count("SELECT count(*) FILTER (WHERE pg_terminate_backend(holder_pid)) FROM locks");
  ASSERT_TRUE(wait_for([&] { return cluster.epoch() > epoch && !cluster.leader().empty(); }, 20s))
      << cluster.logs();
  EXPECT_TRUE(wait_for(
      [&] { return cluster.process(first).log().find("leadership LOST") != std::string::npos; },
      10s))
      << cluster.process(first).log();
  enqueue(cluster, "noop", "{}", 50);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 50; }, 20s))
      << cluster.logs();
}

TEST(Election, StepDownHandsLeadershipToAnotherNode) {
  Cluster cluster(unique_schema("stepdown"), 2);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  std::string out;
  ASSERT_EQ(run_command(binary("batonctl") + " --database-url '" + database_url() + "' --schema " +
                            cluster.schema() + " leader --step-down",
                        &out),
            0)
      << out;
  // The leader batonctl asked: the one named above may have lost a slow first renewal while the
  // suite started, and handed over before the request.
  const auto asked = out.find("asked ");
  ASSERT_NE(asked, std::string::npos) << out;
  const auto name_end = out.find(" (epoch", asked);
  ASSERT_NE(name_end, std::string::npos) << out;
  const std::string first = out.substr(asked + 6, name_end - asked - 6);
  const auto ids = cluster.node_ids();
  ASSERT_NE(std::find(ids.begin(), ids.end(), first), ids.end()) << out;
  const auto second = cluster.wait_leader(10s, first);
  ASSERT_NE(second, "") << cluster.logs();
  EXPECT_TRUE(cluster.process(first).running());
  // As a follower again it tries the lock every retry interval, not in a busy loop (a wake-up
  // of its step-down that stayed pending once made every later wait return at once).
  const double before = cpu_seconds(cluster.process(first).pid());
  wait_for([] { return false; }, 3s, 100ms);
  const double used = cpu_seconds(cluster.process(first).pid()) - before;
  EXPECT_LT(used, 0.15) << "the former leader used " << used << " s of CPU in 3 s as a follower";
  enqueue(cluster, "noop", "{}", 20);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 20; }, 20s));
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE node <> '" + second + "'"), 0)
      << cluster.logs();
}

TEST(Election, AStaleHolderThatStillHoldsTheLockIsEvicted) {
  const std::string schema = unique_schema("evict");
  Cluster cluster(schema, 0);
  // A ghost leader: a live session that holds the advisory lock, whose lease ran out long ago
  // and that will never renew (as a frozen process behind a half-open connection would).
  auto ghost = baton::detail::connect(
      {.url = database_url(), .schema = schema, .application_name = "ghost@" + schema});
  {
    pqxx::nontransaction tx(*ghost);
    tx.exec(
        "SELECT pg_advisory_lock(hashtextextended(current_schema() || "
        "'/default/baton-leader', 0))");
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, renewed_at, expires_at, "
        "holder_pid) VALUES ('baton-leader', 'default', 'ghost', 7, now() - interval '10s', "
        "now() - interval '5s', pg_backend_pid())");
  }
  cluster.start("n1");
  ASSERT_EQ(cluster.wait_leader(20s), "n1") << cluster.logs();
  EXPECT_EQ(cluster.epoch(), 8) << "the epoch continues from the evicted holder's";
  EXPECT_NE(cluster.process("n1").log().find("EVICTING stale leader: node=ghost epoch=7"),
            std::string::npos)
      << cluster.logs();
  EXPECT_THROW(pqxx::nontransaction(*ghost).exec("SELECT 1"), std::exception)
      << "the ghost's session should have been terminated";
  ASSERT_TRUE(wait_for([&] { return !cluster.metrics_addr("n1").empty(); }, 10s));
  std::string page;
  EXPECT_TRUE(wait_for(
      [&] {
        page = http_get(cluster.metrics_addr("n1"), "/metrics");
        return metric_sum(page, "baton_evictions_total") == 1;
      },
      10s))
      << page;
}

TEST(Election, DeploymentsInTwoSchemasOfOneDatabaseEachHaveALeader) {
  // Advisory locks are database-wide: the key must include the schema, or one deployment's
  // leader would keep the other's nodes waiting forever.
  Cluster a(unique_schema("tenant_a"), 1);
  Cluster b(unique_schema("tenant_b"), 1);
  EXPECT_EQ(a.wait_leader(20s), "n1") << a.logs();
  EXPECT_EQ(b.wait_leader(20s), "n1") << b.logs();
}

TEST(Election, BadSettingsAreRefusedAtStartup) {
  struct Case {
    std::string flags;
    std::string expect;
  };
  const std::vector<Case> cases{
      {"--renew-interval 2s", "renew-interval"},
      {"--lock-ttl 1s --renew-interval 500ms", "use renew-interval <= 296ms"},
      {"--lock-ttl 300ms --lease-margin 290ms", "lease-margin"},
      {"--lock-ttl -1s", "lock-ttl"},
      {"--lock-ttl 2x", "unknown unit"},
      {"--retry-interval 100", "has no unit"},
      {"--threads 0", "threads"},
      {"--schema 'a;b'", "schema"},
      {"--metrics-listen nowhere", "metrics-listen"},
  };
  for (const auto& c : cases) {
    std::string out;
    const int rc =
        run_command(binary("batond") + " --database-url '" + database_url() + "' " + c.flags, &out);
    EXPECT_EQ(rc, 2) << c.flags << ": " << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.flags << ": " << out;
  }
  std::string out;
  EXPECT_EQ(run_command("env -u DATABASE_URL " + binary("batond"), &out), 2) << out;
  EXPECT_NE(out.find("DATABASE_URL"), std::string::npos) << out;
}

}  // namespace
