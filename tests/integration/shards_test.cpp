// Shards with the nodes in this process, so that the sanitizer runs see the balancer, its
// hand-over thread and the consumer's lanes at work: two nodes share the shards, the second one's
// arrival moves shards by graceful hand-over, and epochs stay unique across the shards' rows.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "baton/detail/db.h"
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

TEST_F(ShardsInProcess, AShutdownStopsEveryShardsClaimsAtOnce) {
  // A shutdown (or a step-down) waits for each shard's claim in flight. On a slow server (here a
  // trigger makes every claim of "slow" jobs take 0.4 s) the lanes must all stop claiming when
  // the drain begins: waiting for one lane's claim while the others went on claiming made the
  // drain take a claim's time per shard, and claimed jobs only to put them back.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE TABLE claim_log (started timestamptz NOT NULL)");
    tx.exec(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.type = 'slow' AND OLD.state = 'available' AND NEW.state = 'running' AND "
        "current_setting('baton_test.claim_slept', true) IS DISTINCT FROM 'yes' THEN "
        "PERFORM pg_catalog.set_config('baton_test.claim_slept', 'yes', true); "
        "INSERT INTO " +
        schema_ +
        ".claim_log VALUES (pg_catalog.statement_timestamp()); "
        "PERFORM pg_catalog.pg_sleep(0.4); END IF; RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION "
        "slow_claim()");
  }
  auto c = config("n1");
  c.batch_size = 4;  // a few jobs a claim: the queue lasts through the test
  auto node =
      std::make_unique<RunningNode>(c, [](Node& n) { n.handle("slow", [](JobContext&) {}); });
  ASSERT_TRUE(shares_become({{"n1", 4}})) << node->error();
  Client(database_url(), schema_).enqueue_copies("slow", {}, 4000);
  ASSERT_EQ(count("SELECT count(DISTINCT shard) FROM jobs"), 4);
  // Every lane at work: two slow claims each, on average.
  ASSERT_TRUE(wait_count("SELECT count(*) FROM claim_log", 8, 20s));
  const auto began = query_value(*db_, "SELECT clock_timestamp()::text");
  const auto t0 = std::chrono::steady_clock::now();
  node.reset();
  std::printf(
      "[ info ] shutdown of a node leading 4 shards whose claims take 0.4 s: %.0f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_GT(count("SELECT count(*) FROM jobs"), 0) << "the queue ran dry: the test proves nothing";
  // Claims that started once the drain had begun (350 ms after the test asked, for the node's
  // own steps before it on a loaded machine: its thread wakes, the balancer stands aside). A lane
  // left claiming starts a claim every 0.4 s, for as long as the drain waits on the others.
  EXPECT_EQ(count("SELECT count(*) FROM claim_log WHERE started > '" + began +
                  "'::timestamptz + interval '350 milliseconds'"),
            0)
      << "lanes went on claiming while the drain waited for another lane's claim";
  // The claims in flight came back (none was cut, leaving its jobs running for a rescue), and
  // nothing was lost: every job is queued or in history.
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running'"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM jobs") + count("SELECT count(*) FROM job_history"), 4000);
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

TEST_F(ShardsInProcess, AQueueLimitedAcrossTheClusterGoesOnAsItsJobsEndWithoutTheGather) {
  // With shards a queue's limit is kept across the cluster: a claim takes only the places that
  // no lane's running jobs hold, so it comes back short while a backlog waits, and a place is
  // free again only once its job's end is written. The completer must wake the sleeping leader
  // then (its poll is a minute here), and the next claim must not wait for the gather (100 ms).
  auto c = config("n1");
  c.shards = 2;
  c.threads = 4;
  c.poll_interval = std::chrono::minutes(1);
  c.claim_gather = 100ms;
  c.queue_concurrency = {{"default", 2}};
  Client(database_url(), schema_).enqueue_copies("noop", {}, 200);
  RunningNode n(c, [](Node& node) { node.handle("noop", [](JobContext&) {}); });
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 200; }, 30s))
      << count("SELECT count(*) FROM job_history") << " of 200 jobs ran; " << n.error();
  // A claim's jobs share their started_at; a claim 90 ms or more after the one before came
  // after a gather.
  const std::string claims_sql = "SELECT DISTINCT started_at AS t FROM job_history";
  const auto claims = count("SELECT count(*) FROM (" + claims_sql + ") c");
  const auto late =
      count("SELECT count(*) FROM (SELECT t - lag(t) OVER (ORDER BY t) AS gap FROM (" + claims_sql +
            ") c) g WHERE gap >= interval '90 milliseconds'");
  ASSERT_GE(claims, 100);
  EXPECT_LE(late * 10, claims) << late << " of " << claims << " claims came after a gather";
}

TEST_F(ShardsInProcess, AJobEndingOnOneNodeWakesTheOtherNodesLeaderOfItsLimitedQueue) {
  // One running job at a time across the cluster, its jobs on both shards, each shard led by
  // another node that polls once a minute. The node that lost the race for the place sleeps;
  // only the end written on the other node frees it, so that node must wake it (a NOTIFY, as an
  // enqueue sends): its completer for a job's outcome, or the handler's own transaction for a
  // transactional handler. Otherwise the sleeping node's shard's jobs wait for its poll.
  auto make = [&](const std::string& id) {
    auto c = config(id);
    c.shards = 2;
    c.threads = 2;
    c.poll_interval = std::chrono::minutes(1);
    c.queue_concurrency = {{"default", 1}};
    return c;
  };
  auto setup = [](Node& node) {
    node.handle("nap", [](JobContext&) { std::this_thread::sleep_for(20ms); });
    node.handle_tx("tx_nap", [](JobContext&, pqxx::work&) { std::this_thread::sleep_for(20ms); });
  };
  RunningNode n1(make("n1"), setup);
  ASSERT_TRUE(shares_become({{"n1", 2}})) << n1.error();
  RunningNode n2(make("n2"), setup);
  ASSERT_TRUE(shares_become({{"n1", 1}, {"n2", 1}})) << n1.error() << n2.error();
  long long want = 0;
  for (const char* type : {"nap", "tx_nap"}) {
    Client(database_url(), schema_).enqueue_copies(type, {}, 40);
    want += 40;
    ASSERT_EQ(count("SELECT count(DISTINCT shard) FROM jobs"), 2) << type;
    EXPECT_TRUE(wait_count("SELECT count(*) FROM job_history", want, 20s))
        << type << ": " << count("SELECT count(*) FROM job_history") << " of " << want
        << " jobs ran; " << n1.error() << n2.error();
    EXPECT_EQ(count("SELECT count(DISTINCT node) FROM job_history WHERE type = '" +
                    std::string(type) + "'"),
              2)
        << type;
  }
}

TEST_F(ShardsInProcess, TheEndOfAJobOneShardsClaimingThreadRanLetsAnotherShardsJobStart) {
  // One node leads two shards on two threads. Each lane's claiming thread runs the job that
  // woke it: a long one on shard 1, then a short one on shard 0, which fill both places. Shard
  // 1's next job finds no place (its lane already has its fair share running) and its poller
  // sleeps for the poll interval, a minute here. The short job's end must wake it: otherwise
  // the job waits for the long one to end.
  auto c = config("n1");
  c.shards = 2;
  c.threads = 2;
  c.poll_interval = std::chrono::minutes(1);
  std::atomic<bool> release{false};
  std::atomic<bool> long_started{false};
  std::atomic<bool> short_started{false};
  std::atomic<bool> next_started{false};
  std::atomic<bool> next_before_long_ended{false};
  RunningNode n(c, [&](Node& node) {
    node.handle("long", [&](JobContext&) {
      long_started = true;
      wait_for([&] { return release.load(); }, 10s);
    });
    node.handle("short", [&](JobContext&) {
      short_started = true;
      std::this_thread::sleep_for(300ms);
    });
    node.handle("next", [&](JobContext&) {
      next_before_long_ended = !release.load();
      next_started = true;
    });
  });
  ASSERT_TRUE(shares_become({{"n1", 2}})) << n.error();
  // Both lanes asleep holding their wake keys (sessions other than the leases').
  ASSERT_TRUE(wait_count(
      "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
      "WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted "
      "AND a.application_name = '" +
          baton::detail::node_application_name("n1", schema_) +
          "' AND l.pid NOT IN (SELECT holder_pid FROM locks WHERE holder_pid IS NOT NULL)",
      2, 20s));
  // A partition key of each shard.
  auto key_on = [&](int shard) {
    return query_value(*db_,
                       "SELECT 'k' || i FROM generate_series(1, 100) i WHERE shard_of('k' "
                       "|| i, 2) = " +
                           std::to_string(shard) + " ORDER BY i LIMIT 1");
  };
  const auto on0 = key_on(0);
  const auto on1 = key_on(1);
  Client client(database_url(), schema_);
  client.enqueue("long", {}, {.partition_key = on1});
  ASSERT_TRUE(wait_for([&] { return long_started.load(); }, 10s));
  client.enqueue("short", {}, {.partition_key = on0});
  ASSERT_TRUE(wait_for([&] { return short_started.load(); }, 10s));
  client.enqueue("next", {}, {.partition_key = on1 + "-next"});
  const bool started = wait_for([&] { return next_started.load(); }, 6s);
  release = true;
  EXPECT_TRUE(started && next_before_long_ended.load())
      << "shard 1's job waited for the long job to end, not for the short one";
}

}  // namespace
