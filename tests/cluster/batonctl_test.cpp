// batonctl, command by command: its output, and an error for bad input.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/cluster.h"

namespace {

using namespace baton::test;

struct Ctl {
  const Cluster& cluster;
  int rc = -1;
  std::string operator()(const std::string& args, const std::string& stdin_text = "") {
    std::string out;
    // Bounded: a command that waits on a lock the test holds must not hang the suite.
    const std::string cmd = "timeout 120 " + binary("batonctl") + " --database-url '" +
                            database_url() + "' --schema " + cluster.schema() + " " + args;
    if (stdin_text.empty()) {
      rc = run_command(cmd + " < /dev/null", &out);
    } else {
      const std::string file = cluster.dir() + "/stdin.txt";
      std::ofstream(file) << stdin_text;
      rc = run_command(cmd + " < " + file, &out);
    }
    return out;
  }
};

TEST(Batonctl, MigrateStatsLeaderNodesAndEnqueueAnswerAndRefuseBadInput) {
  Cluster cluster(unique_schema("ctl_basic"), 2);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  Ctl ctl{cluster};
  auto out = ctl("migrate");
  EXPECT_EQ(ctl.rc, 0);
  EXPECT_NE(out.find("applied 0 migration(s)"), std::string::npos) << out;
  out = ctl("--json leader");
  EXPECT_EQ(ctl.rc, 0);
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j[0]["lease_valid"], true) << out;
  EXPECT_EQ(j[0]["epoch"], 1) << out;
  out = ctl("nodes");
  EXPECT_NE(out.find("n1"), std::string::npos);
  EXPECT_NE(out.find("live"), std::string::npos) << out;
  out = ctl("enqueue --type noop --count 3 --queue q1");
  EXPECT_NE(out.find("enqueued 3 job(s)"), std::string::npos) << out;
  ctl("enqueue --type noop --payload '{not json'");
  EXPECT_EQ(ctl.rc, 2);
  ctl("enqueue --type 'bad type'");
  EXPECT_EQ(ctl.rc, 2);
  ctl("enqueue --type noop --delay soon");
  EXPECT_EQ(ctl.rc, 2);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 3; }, 20s));
  out = ctl("--json stats");
  EXPECT_NE(out.find("\"queue\": \"q1\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"completed\": 3"), std::string::npos) << out;
  out = ctl("stats --bogus");
  EXPECT_EQ(ctl.rc, 2) << "bad usage exits 2: " << out;
  EXPECT_NE(out.find("--bogus"), std::string::npos) << out;
  out = ctl("bogus");
  EXPECT_EQ(ctl.rc, 2) << out;
  EXPECT_NE(out.find("unknown command 'bogus'"), std::string::npos) << out;
  out = ctl("enqueue --type noop --count abc");
  EXPECT_EQ(ctl.rc, 2) << out;
  out = ctl("dead list --limit -1");
  EXPECT_EQ(ctl.rc, 2) << out;
  EXPECT_NE(out.find("--limit -1 is out of range"), std::string::npos) << out;
  EXPECT_EQ(out.find("ERROR"), std::string::npos) << "a raw server error: " << out;

  std::string no_db;
  EXPECT_EQ(run_command("env -u DATABASE_URL " + binary("batonctl") + " stats", &no_db), 2)
      << no_db;
  EXPECT_NE(no_db.find("DATABASE_URL"), std::string::npos) << no_db;
  EXPECT_EQ(run_command(binary("batonctl") + " --database-url postgresql://x@127.0.0.1:1/x stats",
                        &no_db),
            1)
      << no_db;
  EXPECT_NE(no_db.find("cannot reach the database"), std::string::npos) << no_db;
  EXPECT_EQ(run_command(binary("batonctl") + " --database-url '" + database_url() +
                            "' --schema 'x;y' stats",
                        &no_db),
            2)
      << no_db;
}

TEST(Batonctl, EnqueueReadsJsonLinesFromAFileOrStdin) {
  Cluster cluster(unique_schema("ctl_lines"), 0);
  Ctl ctl{cluster};
  std::string lines;
  for (int i = 0; i < 2500; ++i)
    lines += "{\"i\": " + std::to_string(i) + "}\n";
  auto out = ctl("enqueue --type noop --file -", lines);
  EXPECT_EQ(ctl.rc, 0) << out;
  EXPECT_NE(out.find("enqueued 2500 job(s) from 2500 line(s)"), std::string::npos) << out;
  out = ctl("enqueue --file -",
            "{\"type\": \"a\", \"queue\": \"qa\", \"payload\": {\"x\": 1}}\n"
            "\n{\"type\": \"b\", \"priority\": 5}\n");
  EXPECT_EQ(ctl.rc, 0) << out;
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs WHERE type = 'a' AND queue = 'qa'"), 1);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs WHERE type = 'b' AND priority = 5"), 1);
  out = ctl("enqueue --file -", "{\"type\": \"a\"}\nnot json\n");
  EXPECT_EQ(ctl.rc, 2);
  EXPECT_NE(out.find("line 2 is not JSON"), std::string::npos) << out;
  out = ctl("enqueue --file -", "{\"payload\": {}}\n");
  EXPECT_EQ(ctl.rc, 2);
  EXPECT_NE(out.find("line 1 has no \"type\""), std::string::npos) << out;
  ctl("enqueue --file /nonexistent/jobs.jsonl");
  EXPECT_EQ(ctl.rc, 2);
}

TEST(Batonctl, ADrillTimesAStepDownAndAKill) {
  Cluster cluster(unique_schema("ctl_drill"), 2);
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  Ctl ctl{cluster};
  auto out = ctl("drill --timeout 20s");
  EXPECT_EQ(ctl.rc, 0) << out << cluster.logs();
  EXPECT_NE(out.find("asked " + first), std::string::npos) << out;
  EXPECT_NE(out.find("granted epoch 2"), std::string::npos) << out;
  EXPECT_NE(out.find("failover took"), std::string::npos) << out;
  const auto second = cluster.wait_leader(10s);
  out = ctl("--json drill --kill --timeout 20s");
  EXPECT_EQ(ctl.rc, 0) << out << cluster.logs();
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << out;
  EXPECT_EQ(j["leader"], second);
  EXPECT_EQ(j["killed"], true);
  EXPECT_GE(j["first_job_ms"].get<long long>(), j["granted_ms"].get<long long>());
  EXPECT_EQ(cluster.process(second).wait(5s), 128 + SIGKILL);
  ctl("drill --timeout later");
  EXPECT_EQ(ctl.rc, 2);
}

}  // namespace

namespace {

using namespace baton::test;

// A schema as the release before migration 0022 (which alters the jobs table) left it, and a
// session named `holder_name` idle in a transaction that read jobs: an upgrade's migration
// cannot lock the table until that transaction ends.
struct SchemaInUse {
  static constexpr int kBefore = 21;
  std::string schema;
  std::unique_ptr<pqxx::connection> conn;
  std::unique_ptr<pqxx::connection> holder;
  std::unique_ptr<pqxx::work> hold;

  SchemaInUse(std::string name, const std::string& holder_name) : schema(std::move(name)) {
    conn = baton::detail::connect({.url = database_url(), .schema = schema});
    if (baton::detail::migrate(*conn, schema, kBefore) != kBefore) {
      throw std::runtime_error("could not set up " + schema + " at version 21");
    }
    holder = baton::detail::connect(
        {.url = database_url(), .schema = schema, .application_name = holder_name});
    hold = std::make_unique<pqxx::work>(*holder);
    hold->exec("SELECT count(*) FROM jobs");  // its lock on jobs lasts until it ends
  }
  ~SchemaInUse() {
    hold.reset();
    try {
      pqxx::nontransaction(*conn).exec("DROP SCHEMA " + schema + " CASCADE");
    } catch (const std::exception&) {
      // A node still on it: the next run's schemas have other names.
    }
  }
  int version() { return baton::detail::current_schema_version(*conn, schema); }
};

TEST(Batonctl, MigrateBehindAnOpenTransactionGivesUpAndSaysWhoHoldsTheLock) {
  // batonctl migrate waits --lock-timeout, applies nothing, names the session, and exits 1;
  // once that session ends, the same command applies the migrations.
  SchemaInUse in_use(unique_schema("ctl_lock_wait_old"), "report-job");
  Cluster cluster(unique_schema("ctl_lock_wait"), 0);
  Ctl ctl{cluster};
  auto out = ctl("--schema " + in_use.schema + " migrate --lock-timeout 300ms");
  EXPECT_EQ(ctl.rc, 1) << out;
  EXPECT_NE(out.find("0022_job_domains.sql waited 300 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("pid " + std::to_string(in_use.holder->backendpid()) + " (role "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("application 'report-job', idle in transaction; its transaction began "),
            std::string::npos)
      << out;
  EXPECT_EQ(in_use.version(), SchemaInUse::kBefore);
  in_use.hold->commit();
  out = ctl("--schema " + in_use.schema + " migrate --lock-timeout 300ms");
  EXPECT_EQ(ctl.rc, 0) << out;
  const int rest = baton::detail::latest_schema_version() - SchemaInUse::kBefore;
  EXPECT_NE(out.find("applied " + std::to_string(rest) + " migration(s)"), std::string::npos)
      << out;
}

TEST(Batonctl, ANodeUpgradingBehindAnOpenTransactionGivesWayThenMigratesOnceItEnds) {
  // A node that migrates at start waits a second for each lock, logs who holds it, and tries
  // again later by itself; once the transaction ends it migrates and starts.
  SchemaInUse in_use(unique_schema("node_lock_wait_old"), "nightly-export");
  Cluster cluster(unique_schema("node_lock_wait"), 0);  // its nodes end before the schema goes
  cluster.start("n1", {"--schema", in_use.schema});
  ASSERT_TRUE(wait_for(
      [&] {
        const auto logs = cluster.logs();
        return logs.find("0022_job_domains.sql waited 1 s") != std::string::npos &&
               logs.find("application 'nightly-export', idle in transaction") != std::string::npos;
      },
      30s))
      << cluster.logs();
  EXPECT_EQ(in_use.version(), SchemaInUse::kBefore);
  EXPECT_TRUE(cluster.process("n1").running()) << "the node waits, it does not exit";
  in_use.hold->commit();
  // Its next try comes 10-20 s after the first (kMigrationRetry).
  ASSERT_TRUE(
      wait_for([&] { return in_use.version() == baton::detail::latest_schema_version(); }, 60s))
      << cluster.logs();
  ASSERT_TRUE(wait_for(
      [&] { return cluster.logs().find("database ready: " + in_use.schema) != std::string::npos; },
      30s))
      << cluster.logs();
  // The try that gave way is counted where operators alert on database errors.
  std::string page;
  ASSERT_TRUE(wait_for(
      [&] {
        const auto addr = query_value(*in_use.conn, "SELECT metrics_addr FROM " + in_use.schema +
                                                        ".nodes WHERE node_id = 'n1'");
        page = addr.empty() ? "" : scrape(addr);
        return !page.empty();
      },
      30s))
      << cluster.logs();
  EXPECT_GE(metric_sum(page, "baton_database_errors_total{component=\"migrate\"}"), 1) << page;
}

TEST(Batonctl, EverySubcommandRefusesBadInputWithWhatToDo) {
  Cluster cluster(unique_schema("ctl_errors"), 0);
  Ctl ctl{cluster};
  // migrate: a schema name that is not allowed.
  auto out = ctl("--schema 'Bad-Name' migrate");
  EXPECT_EQ(ctl.rc, 2);
  EXPECT_NE(out.find("use 1..56 of a-z, 0-9 and _"), std::string::npos) << out;
  // migrate: a lock wait that is not a duration.
  out = ctl("migrate --lock-timeout soon");
  EXPECT_EQ(ctl.rc, 2) << out;
  EXPECT_NE(out.find("lock-timeout: 'soon' is not a duration"), std::string::npos) << out;
  out = ctl("migrate --lock-timeout 0.4ms");
  EXPECT_EQ(ctl.rc, 2) << out;
  EXPECT_NE(out.find("'0.4ms' is under 1 ms"), std::string::npos) << out;
  out = ctl("migrate --lock-timeout 1000h");
  EXPECT_EQ(ctl.rc, 2) << out;
  EXPECT_NE(out.find("'1000h' is over 24h"), std::string::npos) << out;
  // leader --step-down with no node running.
  out = ctl("leader --step-down");
  EXPECT_EQ(ctl.rc, 1);
  EXPECT_NE(out.find("no node leads now"), std::string::npos) << out;
  out = ctl("leader");
  EXPECT_NE(out.find("no node has led yet"), std::string::npos) << out;
  // nodes, stats, schedules on a schema baton never installed.
  for (const char* cmd : {"nodes", "stats", "schedules", "sagas list"}) {
    out = ctl(std::string("--schema never_installed_here ") + cmd);
    EXPECT_EQ(ctl.rc, 1) << cmd << ": " << out;
    EXPECT_NE(out.find("run 'batonctl migrate'"), std::string::npos) << cmd << ": " << out;
  }
  // schedules and sagas on an installed but empty schema.
  out = ctl("schedules");
  EXPECT_EQ(ctl.rc, 0);
  EXPECT_NE(out.find("(no schedules)"), std::string::npos) << out;
  out = ctl("sagas show not-a-uuid");
  EXPECT_EQ(ctl.rc, 1);
  EXPECT_NE(out.find("no saga not-a-uuid"), std::string::npos) << out;
  out = ctl("sagas show");
  EXPECT_NE(ctl.rc, 0) << "an id is required: " << out;
  out = ctl("dead show 424242");
  EXPECT_EQ(ctl.rc, 1);
  EXPECT_NE(out.find("no dead job 424242"), std::string::npos) << out;
  out = ctl("queue ordered sms");
  EXPECT_NE(ctl.rc, 0) << "--partitions is required: " << out;
}

}  // namespace
