// Shards with the nodes in this process, so that the sanitizer runs see the balancer, its
// hand-over thread and the consumer's lanes at work: two nodes share the shards, the second one's
// arrival moves shards by graceful hand-over, and epochs stay unique across the shards' rows.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>

#include "support/node_runner.h"
#include "support/schema_test.h"
#include "support/support.h"

namespace {

using namespace baton::test;
using baton::Client;
using baton::JobContext;
using baton::Node;

class ShardsInProcess : public SchemaTest {
 protected:
  baton::NodeConfig config(const std::string& id) {
    auto c = test_config(schema_, id);
    c.shards = 4;
    // Hand-overs here must be graceful: a lease of 2 s, so that a busy 2-core machine (a cluster
    // test beside this one, or a sanitizer's slowdown) does not end one by a late renewal.
    c.lock_ttl = std::chrono::seconds(2);
    return c;
  }
  // Valid leases by node.
  std::map<std::string, long long> shares() {
    std::map<std::string, long long> out;
    pqxx::nontransaction tx(*db_);
    for (const auto& r : tx.exec("SELECT client_id, count(*) FROM locks "
                                 "WHERE expires_at > clock_timestamp() GROUP BY 1")) {
      out[r[0].c_str()] = r[1].as<long long>();
    }
    return out;
  }
  // Waits until the valid leases by node are `want` (20 s at most).
  bool shares_become(const std::map<std::string, long long>& want) {
    return wait_for([&] { return shares() == want; }, 20s);
  }
};

TEST_F(ShardsInProcess, ASecondNodeTakesItsShareByHandOverAndEveryJobRunsOnce) {
  std::mutex m;
  std::map<std::int64_t, int> runs;
  std::map<std::string, int> by_node;
  auto setup = [&](Node& node) {
    node.handle("nap", [&, id = node.config().node_id](JobContext& ctx) {
      {
        std::lock_guard lock(m);
        ++runs[ctx.job().id];
        ++by_node[id];
      }
      std::this_thread::sleep_for(10ms);
    });
  };
  RunningNode n1(config("n1"), setup);
  ASSERT_TRUE(shares_become({{"n1", 4}})) << n1.error();
  constexpr int kJobs = 2000;  // seconds of work: the hand-over comes while jobs run
  Client(database_url(), schema_).enqueue_copies("nap", {}, kJobs);
  EXPECT_GT(count("SELECT count(DISTINCT shard) FROM jobs"), 1);
  {
    RunningNode n2(config("n2"), setup);
    ASSERT_TRUE(shares_become({{"n1", 2}, {"n2", 2}})) << n1.error() << n2.error();
    EXPECT_GT(count("SELECT count(*) FROM jobs"), 0)
        << "the queue was empty before the hand-over: the test proves nothing";
    ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", kJobs, 60s));
  }
  // n2 stopped (gracefully): its shards come back to n1.
  ASSERT_TRUE(shares_become({{"n1", 4}}));
  std::lock_guard lock(m);
  EXPECT_EQ(runs.size(), static_cast<std::size_t>(kJobs));
  for (const auto& [id, n] : runs)
    EXPECT_EQ(n, 1) << "job " << id << " ran " << n << " times";
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE attempts <> 1"), 0);
  EXPECT_GT(by_node["n2"], 0) << "n2 ran none of the jobs";
  EXPECT_EQ(count("SELECT count(*) FROM leadership_events WHERE event = 'released' "
                  "AND reason = 'stepped_down'") > 0,
            true)
      << "no shard was handed over";
}

TEST_F(ShardsInProcess, YieldDrainsThenHandsEveryShardToTheOtherNode) {
  // Node::yield() (what a step-down request does): the node drains its running jobs, releases
  // every shard it leads, and stands aside while the other node takes them all.
  std::atomic<int> started{0};
  std::atomic<int> cancelled{0};
  auto setup = [&](Node& node) {
    node.handle("slow", [&](JobContext& ctx) {
      ++started;
      const auto until = std::chrono::steady_clock::now() + 400ms;
      while (std::chrono::steady_clock::now() < until && !ctx.cancelled())
        std::this_thread::sleep_for(5ms);
      if (ctx.cancelled()) ++cancelled;
    });
  };
  RunningNode n1(config("n1"), setup);
  ASSERT_TRUE(shares_become({{"n1", 4}})) << n1.error();
  Client(database_url(), schema_).enqueue_copies("slow", {}, 8);
  ASSERT_TRUE(wait_for([&] { return started.load() > 0; }, 10s));
  RunningNode n2(config("n2"), [](Node&) {});  // leads, runs nothing of type "slow"
  ASSERT_TRUE(wait_for(
      [&] {
        const auto now = shares();
        return now.count("n2") == 1 && now.at("n2") > 0;
      },
      20s));
  n1.node().yield();
  ASSERT_TRUE(shares_become({{"n2", 4}})) << "n1 still leads after yield()";
  EXPECT_FALSE(n1.node().is_leader());
  EXPECT_EQ(cancelled.load(), 0) << "yield() cancelled running jobs instead of draining them";
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE outcome <> 'completed'"), 0);
}

TEST_F(ShardsInProcess, EpochsStayUniqueAcrossShardsWhenARowIsAheadOfTheSequence) {
  // A lock row granted by a node of an older version during an upgrade (or written by hand) is
  // ahead of the epochs sequence: its next grant is larger still, and so is every later one.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('baton-leader', 'default', 'old', 1000, now() - interval '1 minute')");
  }
  RunningNode n1(config("n1"), [](Node&) {});
  ASSERT_TRUE(shares_become({{"n1", 4}})) << n1.error();
  EXPECT_EQ(count("SELECT epoch FROM locks WHERE lock_key = 'baton-leader'"), 1001);
  EXPECT_EQ(count("SELECT count(DISTINCT epoch) FROM locks"), 4);
  // The other shards lose their leases (the server ends their election sessions) and are granted
  // again: from the sequence, now past 1001.
  const auto before = count("SELECT max(epoch) FROM locks WHERE lock_key <> 'baton-leader'");
  count(
      "SELECT count(*) FILTER (WHERE pg_terminate_backend(holder_pid)) FROM locks "
      "WHERE lock_key <> 'baton-leader'");
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM locks WHERE lock_key <> 'baton-leader' AND epoch > " +
                     std::to_string(before) + " AND expires_at > clock_timestamp()",
                 3, 20s))
      << n1.error();
  EXPECT_EQ(count("SELECT count(*) FROM locks WHERE lock_key <> 'baton-leader' AND epoch <= 1001"),
            0)
      << "a shard drew an epoch the sequence had not moved past";
  EXPECT_EQ(count("SELECT count(DISTINCT epoch) FROM locks"), 4);
}

}  // namespace
