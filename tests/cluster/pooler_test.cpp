// Nodes behind PgBouncer, as most deployments run PostgreSQL: a transaction pool in front of the
// election is refused with what to do; the election direct and the handlers pooled works without
// churn and leaves nothing behind in the pool's server sessions; a session pool simply works.
#include <gtest/gtest.h>

#include <signal.h>

#include <baton/client.h>

#include "support/cluster.h"
#include "support/pgbouncer.h"

namespace {

using namespace baton::test;

// Every job of `n` done exactly once, each transactional effect committed once.
void expect_done_once(Cluster& cluster, long long n) {
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == n; }, 60s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(cluster.count("SELECT count(*) - count(DISTINCT job_id) FROM effects"), 0);
}

TEST(Pooler, ATransactionPoolInFrontOfTheElectionIsRefusedWithWhatToDo) {
  PgBouncer bouncer(database_url(), "transaction", 4);
  Cluster cluster(unique_schema("pool_tx_refused"), 0);
  cluster.start("n1", {"--database-url", bouncer.url()});
  const int code = cluster.process("n1").wait(20s);
  const auto log = cluster.process("n1").log();
  EXPECT_EQ(code, 2) << "a node behind a transaction pool must refuse to start\n" << log;
  EXPECT_NE(log.find("transaction pooler"), std::string::npos) << log;
  EXPECT_NE(log.find("--election-database-url"), std::string::npos) << log;
  EXPECT_EQ(cluster.count("SELECT count(*) FROM locks"), 0) << "it must not have run for leader";
}

TEST(Pooler, ElectionDirectAndHandlersThroughATransactionPoolRunWithoutChurn) {
  PgBouncer bouncer(database_url(), "transaction", 4);
  Cluster cluster(unique_schema("pool_tx_split"), 0,
                  {"--database-url", bouncer.url(), "--election-database-url", database_url()});
  create_effects(cluster);
  for (const char* id : {"n1", "n2", "n3"})
    cluster.start(id);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto epoch = cluster.epoch();
  // Producers go through the pool too: the Client's prepared statement does not survive it, so
  // it falls back to plain statements.
  {
    baton::Client client(bouncer.url(), baton::ClientOptions{.schema = cluster.schema()});
    for (int i = 0; i < 300; ++i)
      client.enqueue("record_tx", {{"ms", 2}});
    std::vector<baton::NewJob> batch(700, {"record_tx", {{"ms", 2}}, {}});
    EXPECT_EQ(client.enqueue_batch(batch).size(), 700u);
  }
  expect_done_once(cluster, 1000);
  EXPECT_EQ(cluster.epoch(), epoch) << "leadership churned\n" << cluster.logs();
  EXPECT_EQ(cluster.logs().find("leadership LOST"), std::string::npos) << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM effects"), 1000);
  // Nothing baton set is left on the pool's server sessions for the next client to inherit.
  pqxx::connection neighbour(bouncer.url());
  for (int i = 0; i < 8; ++i) {
    pqxx::nontransaction tx(neighbour);
    EXPECT_EQ(tx.exec("SHOW statement_timeout")[0][0].as<std::string>(), "0");
    EXPECT_EQ(tx.exec("SHOW idle_in_transaction_session_timeout")[0][0].as<std::string>(), "0");
    EXPECT_EQ(tx.exec("SHOW search_path")[0][0].as<std::string>(), "\"$user\", public");
  }
}

TEST(Pooler, NodesThroughASessionPoolWork) {
  // Each node holds about a dozen sessions (election, claims, outcomes, services, handlers).
  PgBouncer bouncer(database_url(), "session", 60);
  Cluster cluster(unique_schema("pool_session"), 0, {"--database-url", bouncer.url()});
  create_effects(cluster);
  for (const char* id : {"n1", "n2", "n3"})
    cluster.start(id);
  const auto leader = cluster.wait_leader(20s);
  ASSERT_NE(leader, "") << cluster.logs();
  const auto epoch = cluster.epoch();
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec(
        "INSERT INTO jobs (queue, type, payload) SELECT 'default', 'record_tx', "
        "'{\"ms\": 2}' FROM generate_series(1, 1000)");
  }
  expect_done_once(cluster, 1000);
  EXPECT_EQ(cluster.epoch(), epoch) << cluster.logs();
  // And a failover through the pool works as it does direct.
  cluster.process(leader).signal(SIGKILL);
  ASSERT_NE(cluster.wait_leader(20s, leader), "") << cluster.logs() << bouncer.log();
}

}  // namespace
