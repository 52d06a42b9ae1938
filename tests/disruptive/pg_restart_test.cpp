// PostgreSQL restarted under a running cluster (as a failover of the database does): every
// session drops; nodes reconnect, one leads again, and no job is lost or finished twice.
// Runs alone (RUN_SERIAL): it restarts the server every other test uses.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support/cluster.h"

namespace {

using namespace baton::test;

TEST(DatabaseLoss, RestartingPostgresMidRunLosesNothing) {
  const char* pgdir = std::getenv("BATON_TEST_PGDIR");
  if (pgdir == nullptr) {
    GTEST_SKIP() << "BATON_TEST_PGDIR is not set: scripts/test sets it to the throwaway server";
  }
  Cluster cluster(unique_schema("pg_restart"), 3);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  constexpr int kJobs = 300;
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec_params(
        "INSERT INTO jobs (queue, type, payload) SELECT 'default', 'sleep', "
        "'{\"ms\": 20}' FROM generate_series(1, $1)",
        kJobs);
  }
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") >= 30; }, 30s))
      << cluster.logs();
  const auto epoch = cluster.epoch();

  std::string out;
  ASSERT_EQ(run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg restart " + pgdir, &out), 0)
      << out;

  // The test's own connection died with the restart too.
  auto reconnect = [&] {
    try {
      cluster.count("SELECT 1");
    } catch (const std::exception&) {
      cluster.reconnect();
    }
  };
  ASSERT_TRUE(wait_for(
      [&] {
        reconnect();
        return cluster.epoch() > epoch && !cluster.leader().empty();
      },
      30s))
      << "no node led again after the restart\n"
      << cluster.logs();
  ASSERT_TRUE(wait_for(
      [&] {
        reconnect();
        return cluster.count("SELECT count(*) FROM job_history") == kJobs;
      },
      60s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs"), 0);
  for (const auto& id : cluster.node_ids()) {
    EXPECT_TRUE(cluster.process(id).running()) << id << " exited when the database went away";
  }
}

}  // namespace
