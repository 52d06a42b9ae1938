// A planned database switchover: a primary with an asynchronous streaming standby (both local,
// started here), nodes on a multi-host URL with target_session_attrs=read-write; the primary
// stops, the standby is promoted, and the cluster carries on there: a leader under a newer
// epoch, nothing lost, nothing committed twice. Prints the time from promotion to the first job.
#include <gtest/gtest.h>

#include <fstream>

#include "support/cluster.h"

namespace {

using namespace baton::test;

std::string pg(const std::string& args) {
  std::string out;
  const int code = run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg " + args, &out);
  if (code != 0) throw std::runtime_error("scripts/pg " + args + ": " + out);
  return out;
}

std::string port_of(const std::string& url) {
  return url.substr(url.rfind(':') + 1, url.rfind('/') - url.rfind(':') - 1);
}

struct Standby {
  explicit Standby(const std::string& dir, const std::string& primary_dir) : dir(dir) {
    pg("standby " + dir + " " + primary_dir);
    std::ifstream in(dir + "/url");
    std::getline(in, url);
  }
  ~Standby() {
    try {
      pg("destroy " + dir);
    } catch (const std::exception&) {
    }
  }
  std::string dir, url;
};

TEST(Switchover, PromotingTheStandbyMovesTheClusterWithoutLosingOrRepeatingWork) {
  const auto dir = temp_dir("switchover");
  ThrowawayServer primary(dir);
  Standby standby(dir + "/standby", dir + "/pg");
  const std::string url = "postgresql://postgres@127.0.0.1:" + port_of(primary.url()) +
                          ",127.0.0.1:" + port_of(standby.url) +
                          "/postgres?target_session_attrs=read-write";
  Cluster cluster(unique_schema("switchover"), 0, {}, url, url);
  create_effects(cluster);
  for (const char* id : {"n1", "n2"})
    cluster.start(id);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  constexpr int kJobs = 2000;
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec_params(
        "INSERT INTO jobs (queue, type, payload) SELECT 'default', 'record_tx', "
        "'{\"ms\": 5}' FROM generate_series(1, $1)",
        kJobs);
  }
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") >= 200; }, 30s))
      << cluster.logs();
  const auto epoch = cluster.epoch();

  // The switchover: a clean stop sends the standby every WAL record first; then promote.
  pg("stop " + dir + "/pg");
  const auto promoted_at = std::chrono::system_clock::now();
  pg("promote " + standby.dir);

  auto on_new_primary = [&](const std::string& sql) {
    try {
      return cluster.count(sql);
    } catch (const std::exception&) {
      cluster.reconnect();  // the multi-host URL finds the writable server
      return cluster.count(sql);
    }
  };
  ASSERT_TRUE(wait_for(
      [&] {
        try {
          return on_new_primary("SELECT count(*) FROM locks WHERE epoch > " +
                                std::to_string(epoch) + " AND expires_at > clock_timestamp()") > 0;
        } catch (const std::exception&) {
          return false;
        }
      },
      30s))
      << "no leader on the promoted standby\n"
      << cluster.logs();
  EXPECT_EQ(on_new_primary("SELECT CASE WHEN pg_is_in_recovery() THEN 1 ELSE 0 END"), 0);
  EXPECT_EQ(on_new_primary("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                           "'%@" +
                           cluster.schema() + "'") > 0,
            true)
      << "the nodes did not reconnect to the promoted standby";
  ASSERT_TRUE(
      wait_for([&] { return on_new_primary("SELECT count(*) FROM job_history") == kJobs; }, 60s))
      << cluster.logs();
  const auto first =
      query_value(cluster.db(),
                  "SELECT (extract(epoch FROM min(started_at)) * 1000000)::bigint::text "
                  "FROM job_history WHERE epoch > " +
                      std::to_string(epoch));
  ASSERT_FALSE(first.empty());
  const auto first_at =
      std::chrono::system_clock::time_point(std::chrono::microseconds(std::stoll(first)));
  std::printf("[ info ] standby promotion to the first job on the new primary: %.0f ms\n",
              std::chrono::duration<double, std::milli>(first_at - promoted_at).count());

  EXPECT_EQ(on_new_primary("SELECT count(DISTINCT id) FROM job_history"), kJobs);
  EXPECT_EQ(on_new_primary("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(on_new_primary("SELECT count(*) FROM dead_jobs"), 0);
  EXPECT_EQ(on_new_primary("SELECT count(*) - count(DISTINCT job_id) FROM effects"), 0)
      << "a transactional effect was committed twice";
  EXPECT_EQ(on_new_primary("SELECT count(*) FROM effects e JOIN job_history h ON h.id = e.job_id "
                           "WHERE e.epoch <> h.epoch"),
            0);
}

}  // namespace
