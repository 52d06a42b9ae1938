// Attacks on a running cluster of real processes: a role with no grants that floods the leader
// channel or squats the leader lock, a job that takes its node down, a forged nodes row aimed at
// batonctl drill --kill, clients that hang on the metrics port, and producer input that would wrap.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "support/cluster.h"
#include "support/roles.h"

namespace {

using namespace baton::test;

// The advisory key of a deployment's default lock group, as anyone can compute it.
std::string lock_key_sql(const std::string& schema) {
  return "hashtextextended('" + schema + "/default/baton-leader', 0)";
}

// Once the stranger is gone and a node leads, no node says a stranger holds the lock any more.
void expect_no_stranger_reported(Cluster& cluster, const std::vector<std::string>& nodes) {
  std::string pages;
  EXPECT_TRUE(wait_for(
      [&] {
        pages.clear();
        for (const auto& id : nodes)
          pages += http_get(cluster.metrics_addr(id), "/metrics");
        return metric_sum(pages, "baton_lock_held_by_stranger") == 0.0;
      },
      10s))
      << "baton_lock_held_by_stranger stayed up after the stranger was ended\n"
      << pages;
}

TEST(HostileCluster, NotifyFloodsFromARoleWithNoGrantsNeitherMoveNorStopLeadership) {
  const auto schema = unique_schema("notify_flood");
  Cluster cluster(schema, 2);
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  const auto epoch = cluster.epoch();
  const auto stranger = role_name(schema, "stranger");
  { pqxx::nontransaction(cluster.db()).exec("CREATE ROLE " + stranger + " LOGIN"); }
  pqxx::connection attacker(url_as(stranger));
  for (int i = 0; i < 60; ++i) {
    pqxx::nontransaction tx(attacker);
    for (const char* payload : {"yield *", "control", "released x"}) {
      tx.exec_params("SELECT pg_notify($1, $2)", schema + "_leader", payload);
    }
    tx.exec("SELECT pg_notify('" + schema + "_leader', 'yield " + leader + "')");
    std::this_thread::sleep_for(50ms);
  }
  cluster.count(
      "SELECT enqueue_many((SELECT jsonb_agg(jsonb_build_object('type', 'noop')) "
      "FROM generate_series(1, 50)))");
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 50; }, 20s))
      << cluster.logs();
  EXPECT_EQ(cluster.epoch(), epoch) << "a role with no grants moved leadership";
  EXPECT_EQ(cluster.leader(), leader);
}

TEST(HostileCluster, AStrangerHoldingTheLeaderLockIsReportedThenEndedOnceTheNodesMay) {
  const auto schema = unique_schema("squatter");
  const auto node_role = role_name(schema, "node");
  const auto stranger = role_name(schema, "stranger");
  Cluster cluster(schema, 0, {}, url_as(node_role));
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("CREATE ROLE " + node_role + " LOGIN");
    tx.exec("CREATE ROLE " + stranger + " LOGIN");
    tx.exec(documented_block("security.md", "grants", "baton_node", schema, node_role));
  }
  // The stranger computes the key and takes the lock before any node stands.
  pqxx::connection squatter(url_as(stranger));
  pqxx::nontransaction(squatter).exec("SELECT pg_advisory_lock(" + lock_key_sql(schema) + ")");
  cluster.start("a");
  cluster.start("b");
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.logs().find("is held by a session that is not a baton node") !=
               std::string::npos;
      },
      30s))
      << cluster.logs();
  EXPECT_NE(cluster.logs().find("grant pg_signal_backend"), std::string::npos) << cluster.logs();
  EXPECT_EQ(cluster.leader(), "");
  const auto page = http_get(cluster.metrics_addr("a"), "/metrics") +
                    http_get(cluster.metrics_addr("b"), "/metrics");
  EXPECT_GE(metric_sum(page, "baton_lock_held_by_stranger"), 1.0) << page;
  // With the grant the docs name, the nodes end the stranger's session and one leads.
  { pqxx::nontransaction(cluster.db()).exec("GRANT pg_signal_backend TO " + node_role); }
  ASSERT_NE(cluster.wait_leader(30s), "") << cluster.logs();
  EXPECT_NE(cluster.logs().find("ended it"), std::string::npos) << cluster.logs();
  EXPECT_THROW(pqxx::nontransaction(squatter).exec("SELECT 1"), pqxx::broken_connection);
  expect_no_stranger_reported(cluster, {"a", "b"});
}

TEST(HostileCluster, AStrangerHoldingAShardNoNodeLedYetIsEndedAndTheShardLed) {
  const auto schema = unique_schema("shard_squatter");
  const auto stranger = role_name(schema, "stranger");
  Cluster cluster(schema, 0);
  { pqxx::nontransaction(cluster.db()).exec("CREATE ROLE " + stranger + " LOGIN"); }
  // Shard 3 has no lock row yet: the stranger takes its key before any node stands.
  pqxx::connection squatter(url_as(stranger));
  pqxx::nontransaction(squatter).exec("SELECT pg_advisory_lock(hashtextextended('" + schema +
                                      "/default/baton-leader:3', 0))");
  cluster.start("a", {"--shards", "4"});
  cluster.start("b", {"--shards", "4"});
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM locks WHERE expires_at > clock_timestamp()") ==
               4;
      },
      30s))
      << "shard 3 stayed without a leader\n"
      << cluster.logs();
  EXPECT_NE(cluster.logs().find("ended it"), std::string::npos) << cluster.logs();
  EXPECT_THROW(pqxx::nontransaction(squatter).exec("SELECT 1"), pqxx::broken_connection);
  expect_no_stranger_reported(cluster, {"a", "b"});
}

TEST(HostileCluster, AJobThatTakesItsNodeDownRunsAtMostMaxAttemptsThenIsDeadAsCrashed) {
  const auto schema = unique_schema("crasher");
  Cluster cluster(schema, 2);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  cluster.count(
      "CREATE TABLE executions (job_id bigint, node text, epoch bigint, attempt int, "
      "at timestamptz DEFAULT clock_timestamp())");
  cluster.count("SELECT enqueue('q', 'record_ext', '{\"ms\": 60000}', max_attempts => 2)");
  // Each run "crashes" its node: kill -9 whoever runs it, then bring that node back.
  for (int run = 1; run <= 2; ++run) {
    ASSERT_TRUE(
        wait_for([&] { return cluster.count("SELECT count(*) FROM executions") == run; }, 30s))
        << cluster.logs();
    const auto victim = cluster.leader();
    ASSERT_NE(victim, "");
    cluster.process(victim).signal(SIGKILL);
    cluster.process(victim).wait(5s);
    cluster.start(victim);
  }
  ASSERT_TRUE(wait_for(
      [&] { return cluster.count("SELECT count(*) FROM dead_jobs WHERE reason = 'crashed'") == 1; },
      30s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT attempts FROM dead_jobs"), 2);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM executions"), 2) << "it ran a third time";
}

TEST(HostileCluster, DrillKillSignalsOnlyTheLeadersOwnProcess) {
  const auto schema = unique_schema("drill_pid");
  Cluster cluster(schema, 1);
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  // A process that is not the node, and rows the node role could forge.
  Process bystander({"/bin/sleep", "120"}, cluster.dir() + "/bystander.log");
  const std::string ctl = binary("batonctl") + " --database-url '" + database_url() +
                          "' --schema " + schema + " drill --kill --timeout 3s";
  // The forger keeps its lie in place: the node's own heartbeat rewrites its row every renewal,
  // so a trigger pins the pid to the forged value for as long as the test runs.
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("CREATE TABLE forged_pid (pid integer NOT NULL)");
    tx.exec("INSERT INTO forged_pid VALUES (0)");
    tx.exec(
        "CREATE FUNCTION forge_pid() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "NEW.pid := (SELECT pid FROM " +
        schema + ".forged_pid); RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER forge BEFORE INSERT OR UPDATE ON nodes FOR EACH ROW WHEN "
        "(NEW.node_id = '" +
        leader + "') EXECUTE FUNCTION forge_pid()");
  }
  for (const auto& pid : {std::string("0"), std::string("-1"), std::string("1"),
                          std::to_string(bystander.pid()), std::to_string(getpid())}) {
    cluster.count("UPDATE forged_pid SET pid = " + pid);
    cluster.count("UPDATE nodes SET pid = 0 WHERE node_id = '" + leader + "'");
    std::string out;
    EXPECT_EQ(run_command(ctl, &out), 1) << "pid " << pid << ": " << out;
    EXPECT_NE(out.find("refusing to kill"), std::string::npos) << out;
  }
  EXPECT_TRUE(bystander.running()) << "batonctl killed a process that is not the node";
  EXPECT_TRUE(cluster.process(leader).running());
}

// A TCP connection to host:port, or -1.
int open_connection(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(HostileCluster, HealthAndMetricsAnswerWithinASecondWhileHundredsOfClientsHang) {
  const auto schema = unique_schema("slow_clients");
  Cluster cluster(schema, 1);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto addr = cluster.metrics_addr("n1");
  std::vector<int> hanging;
  for (int i = 0; i < 200; ++i) {
    const int fd = open_connection(addr);
    ASSERT_GE(fd, 0);
    if (i % 2 == 1) {
      const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
      ASSERT_GT(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL), 0);
    }
    hanging.push_back(fd);
  }
  // Over several seconds (past the server's request timeout), with slow clients dripping bytes,
  // every probe answers; http_get gives up after 1 s (its receive timeout is set below).
  const auto until = std::chrono::steady_clock::now() + 7s;
  int probes = 0;
  while (std::chrono::steady_clock::now() < until) {
    for (std::size_t i = 1; i < hanging.size(); i += 2)
      send(hanging[i], "x", 1, MSG_NOSIGNAL);
    for (const char* path : {"/healthz", "/metrics"}) {
      const auto started = std::chrono::steady_clock::now();
      const auto body = http_get(addr, path);
      const auto took = std::chrono::steady_clock::now() - started;
      EXPECT_FALSE(body.empty()) << path << " did not answer with 200";
      EXPECT_LT(took, 1s) << path << " answered only after " << (took / 1ms) << " ms";
      ++probes;
    }
    std::this_thread::sleep_for(250ms);
  }
  for (int fd : hanging)
    close(fd);
  EXPECT_GE(probes, 20);
}

TEST(HostileCluster, ProducerNumbersNeverWrapAndUnknownKeysAreRefused) {
  const auto schema = unique_schema("wrap");
  Cluster cluster(schema, 0);
  // Runs batonctl enqueue --file on these lines; returns its exit code, output in `out`.
  std::string out;
  auto enqueue_lines = [&](const std::string& lines) {
    const std::string file = cluster.dir() + "/lines.jsonl";
    std::ofstream(file) << lines;
    return run_command(binary("batonctl") + " --database-url '" + database_url() + "' --schema " +
                           schema + " enqueue --file " + file,
                       &out);
  };
  EXPECT_EQ(enqueue_lines("{\"type\": \"t\", \"max_attempts\": 4294967297}\n"), 2) << out;
  EXPECT_NE(out.find("max_attempts 4294967297 is out of range"), std::string::npos) << out;
  EXPECT_EQ(enqueue_lines("{\"type\": \"t\"}\n{\"type\": \"t\", \"delay\": \"30s\"}\n"), 2) << out;
  EXPECT_NE(out.find("line 2: unknown key 'delay'"), std::string::npos) << out;
  EXPECT_EQ(enqueue_lines("{\"type\": \"t\", \"priority\": 1.5}\n"), 2) << out;
  EXPECT_EQ(enqueue_lines("{\"type\": \"t\", \"priority\": \"7\"}\n"), 2) << out;
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0) << "a refused batch left jobs behind";
  for (const char* sql :
       {"SELECT enqueue_many('[{\"type\": \"t\", \"prio\": 5}]')", "SELECT enqueue(NULL, 't')",
        "SELECT enqueue('q', NULL)", "SELECT enqueue_many('[{\"type\": \"t\", \"queue\": null}]')",
        "SELECT enqueue_many('[{\"type\": \"t\", \"timeout_ms\": 99999999999}]')"}) {
    try {
      cluster.count(sql);
      ADD_FAILURE() << "accepted: " << sql;
    } catch (const pqxx::sql_error& e) {
      EXPECT_EQ(e.sqlstate().substr(0, 2), "BT") << sql << ": " << e.what();
    }
  }
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
}

}  // namespace
