// Running under least privilege, keeping the password secret, and refusing clearly (and
// retrying) when the database is not ready for a node.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/cluster.h"

namespace {

using namespace baton::test;

// The database URL with another user (and optionally a password), key=value form.
std::string as_role(const std::string& role, const std::string& password = "") {
  auto url = baton::describe_database_url(database_url());
  url = url.substr(0, url.find(" user=")) + " user=" + role;
  if (!password.empty()) url += " password=" + password;
  return url;
}

// The grants block of docs/security.md, for `schema` and `role`.
std::string documented_grants(const std::string& schema, const std::string& role) {
  std::ifstream in(std::string(BATON_SOURCE_DIR) + "/docs/security.md");
  std::stringstream doc;
  doc << in.rdbuf();
  const auto text = doc.str();
  const auto begin = text.find("-- grants:begin");
  const auto end = text.find("-- grants:end");
  EXPECT_NE(begin, std::string::npos);
  auto block = text.substr(begin, end - begin);
  block = std::regex_replace(block, std::regex(R"(\bbaton_node\b)"), role);
  block = std::regex_replace(block, std::regex(R"(\bbaton\.)"), schema + ".");
  block = std::regex_replace(block, std::regex(R"(SCHEMA baton\b)"), "SCHEMA " + schema);
  return block;
}

std::string unique_role(const std::string& schema, const std::string& what) {
  return schema.substr(0, 40) + "_" + what;
}

// A password no earlier run used: the role that carries it is a superuser.
std::string fresh_password() {
  std::random_device random;
  char buf[24];
  std::snprintf(buf, sizeof buf, "Pw-%08x%08x", random(), random());
  return buf;
}

// Drops `role` (and what it owns here) when the test ends, passing or failing: a superuser that
// can log in with a password must not outlive its test on the server.
class DroppedAtEnd {
 public:
  DroppedAtEnd(pqxx::connection& db, std::string role) : db_(db), role_(std::move(role)) {}
  DroppedAtEnd(const DroppedAtEnd&) = delete;
  DroppedAtEnd& operator=(const DroppedAtEnd&) = delete;
  ~DroppedAtEnd() {
    try {
      pqxx::nontransaction tx(db_);
      tx.exec("DROP OWNED BY " + tx.quote_name(role_));
      tx.exec("DROP ROLE " + tx.quote_name(role_));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "could not drop role " << role_ << ": " << e.what();
    }
  }

 private:
  pqxx::connection& db_;
  std::string role_;
};

TEST(Security, AClusterRunsUnderTheDocumentedGrantsAndEvictsAFrozenLeader) {
  const auto schema = unique_schema("least_priv");
  const auto role = unique_role(schema, "node");
  Cluster cluster(schema, 0);  // migrated by the test's superuser: the schema's owner
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("CREATE ROLE " + role + " LOGIN");
    tx.exec(documented_grants(schema, role));
  }
  // A frozen leader of the same role: holds the lock, lease long expired.
  auto ghost =
      std::make_unique<pqxx::connection>(as_role(role) + " application_name=ghost@" + schema);
  {
    pqxx::nontransaction tx(*ghost);
    tx.exec("SET search_path TO " + schema);
    tx.exec(
        "SELECT pg_advisory_lock(hashtextextended(current_schema() || '/default/baton-leader', "
        "0))");
  }
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, renewed_at, expires_at, "
        "holder_pid) VALUES ('baton-leader', 'default', 'ghost', 3, now() - interval '1 min', "
        "now() - interval '30 s', " +
        std::to_string(ghost->backendpid()) + ")");
  }
  const std::string dir = cluster.dir();
  std::vector<std::unique_ptr<Process>> nodes;
  for (const char* id : {"a", "b"}) {
    nodes.push_back(std::make_unique<Process>(
        std::vector<std::string>{binary("demo_node"), "--database-url", as_role(role), "--schema",
                                 schema, "--node-id", id, "--no-migrate", "--metrics-listen",
                                 "off"},
        dir + "/" + id + ".log"));
  }
  ASSERT_TRUE(wait_for([&] { return cluster.epoch() == 4 && !cluster.leader().empty(); }, 30s))
      << nodes[0]->log() << nodes[1]->log();
  EXPECT_NE((nodes[0]->log() + nodes[1]->log()).find("EVICTING stale leader: node=ghost"),
            std::string::npos);
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec(
        "SELECT enqueue_many((SELECT jsonb_agg(jsonb_build_object('type', 'record_tx')) FROM "
        "generate_series(1, 20)))");
    tx.exec("CREATE TABLE effects (job_id bigint, node text, epoch bigint)");
    tx.exec("GRANT INSERT ON effects TO " + role);
  }
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 20; }, 30s))
      << nodes[0]->log() << nodes[1]->log();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM effects"), 20);
}

TEST(Security, ARoleWithoutWriteAccessIsRefusedClearlyAndTheNodeWaits) {
  const auto schema = unique_schema("read_only");
  const auto role = unique_role(schema, "ro");
  Cluster cluster(schema, 0);
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("CREATE ROLE " + role + " LOGIN");
    tx.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
    tx.exec("GRANT SELECT ON ALL TABLES IN SCHEMA " + schema + " TO " + role);
  }
  Process node({binary("demo_node"), "--database-url", as_role(role), "--schema", schema,
                "--no-migrate", "--metrics-listen", "127.0.0.1:0"},
               cluster.dir() + "/ro.log");
  ASSERT_TRUE(wait_for([&] { return node.log().find("lacks") != std::string::npos; }, 20s))
      << node.log();
  const auto log = node.log();
  EXPECT_NE(log.find("role " + role + " lacks "), std::string::npos) << log;
  EXPECT_NE(log.find("DELETE on " + schema + ".dead_jobs"), std::string::npos) << log;
  EXPECT_NE(log.find("docs/security.md"), std::string::npos) << log;
  EXPECT_TRUE(node.running()) << "a missing grant is retried, not fatal";
  EXPECT_EQ(cluster.leader(), "") << "it must not lead without its grants";
}

TEST(Security, APasswordNeverAppearsInLogsErrorsConfigOrMetrics) {
  const std::string password = fresh_password();
  const auto schema = unique_schema("secrets");
  const auto role = unique_role(schema, "pw");
  Cluster cluster(schema, 0);
  {
    pqxx::nontransaction tx(cluster.db());
    // Dropped at the end; and should the test be killed first, its password expires anyway.
    const auto until =
        tx.exec("SELECT (now() + interval '10 minutes')::text")[0][0].as<std::string>();
    tx.exec("CREATE ROLE " + role + " LOGIN SUPERUSER PASSWORD " + tx.quote(password) +
            " VALID UNTIL " + tx.quote(until));
  }
  const DroppedAtEnd dropped(cluster.db(), role);
  auto base = baton::describe_database_url(database_url());
  std::smatch m;
  std::regex_search(base, m, std::regex(R"(port=(\d+))"));
  const std::string uri =
      "postgresql://" + role + ":" + password + "@127.0.0.1:" + m[1].str() + "/postgres";
  Process node({binary("demo_node"), "--database-url", uri, "--schema", schema, "--metrics-listen",
                "127.0.0.1:0", "--log-level", "debug"},
               cluster.dir() + "/pw.log");
  ASSERT_TRUE(wait_for([&] { return !cluster.leader().empty(); }, 20s)) << node.log();
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("SELECT enqueue('q', 'fail', '{\"message\": \"boom\"}', max_attempts => 1)");
    tx.exec("SELECT enqueue('q', 'no_such_type')");  // waits for a handler, shown in /metrics
  }
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM dead_jobs") == 1; }, 20s));
  std::string everything = node.log();
  const auto addr = query_value(cluster.db(), "SELECT metrics_addr FROM nodes LIMIT 1");
  everything += http_get(addr, "/metrics");
  std::string out;
  run_command(binary("demo_node") + " --database-url '" + uri + "' --print-config", &out);
  everything += out;
  const std::string dead = "postgresql://" + role + ":" + password + "@127.0.0.1:1/postgres";
  run_command(binary("batonctl") + " --database-url '" + dead + "' stats", &out);
  everything += out;
  run_command(binary("batonctl") + " --database-url '" + uri + "' --schema nosuch stats", &out);
  everything += out;
  {
    Process unreachable({binary("demo_node"), "--database-url", dead, "--metrics-listen", "off"},
                        cluster.dir() + "/dead.log");
    ASSERT_TRUE(wait_for(
        [&] { return unreachable.log().find("database unreachable") != std::string::npos; }, 20s));
    everything += unreachable.log();
  }
  node.signal(SIGTERM);
  node.wait(20s);
  everything += node.log();
  EXPECT_GT(everything.size(), 1000u);
  EXPECT_EQ(everything.find(password), std::string::npos)
      << "the password leaked:\n"
      << everything.substr(everything.find(password) > 300 ? everything.find(password) - 300 : 0,
                           600);
}

TEST(Security, AMissingOrNewerSchemaIsRetriedWithOneClearMessage) {
  const auto schema = unique_schema("not_ready");
  Process node({binary("demo_node"), "--database-url", database_url(), "--schema", schema,
                "--no-migrate", "--metrics-listen", "off", "--node-id", "patient"},
               temp_dir(schema) + "/node.log");
  ASSERT_TRUE(wait_for(
      [&] {
        return node.log().find("has no baton tables; run 'batonctl migrate'") != std::string::npos;
      },
      20s))
      << node.log();
  EXPECT_TRUE(node.running());
  auto conn = baton::detail::connect({.url = database_url(), .schema = schema});
  baton::detail::migrate(*conn, schema);
  ASSERT_TRUE(
      wait_for([&] { return query_value(*conn, "SELECT client_id FROM locks") == "patient"; }, 30s))
      << "the node did not start once the schema appeared\n"
      << node.log();
  // One message per problem, not one per retry.
  const auto log = node.log();
  std::size_t times = 0;
  for (auto at = log.find("has no baton tables"); at != std::string::npos;
       at = log.find("has no baton tables", at + 1)) {
    ++times;
  }
  EXPECT_EQ(times, 1u) << log;

  // A schema from a newer binary: refused clearly, retried.
  {
    pqxx::nontransaction tx(*conn);
    tx.exec("INSERT INTO schema_migrations (version, name) VALUES (999, 'future')");
  }
  Process newer({binary("demo_node"), "--database-url", database_url(), "--schema", schema,
                 "--no-migrate", "--metrics-listen", "off", "--node-id", "older"},
                temp_dir(schema + "_2") + "/node.log");
  ASSERT_TRUE(wait_for(
      [&] { return newer.log().find("newer than this binary knows") != std::string::npos; }, 20s))
      << newer.log();
  EXPECT_TRUE(newer.running());
}

}  // namespace
