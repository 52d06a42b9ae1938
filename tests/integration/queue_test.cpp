// The queue end to end against a real PostgreSQL, with a node running in this process.
#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/node_runner.h"
#include "support/support.h"

namespace {

using namespace baton::test;
using baton::Client;
using baton::EnqueueOptions;
using baton::JobContext;
using baton::Node;

struct Invoice {
  std::string customer;
  int cents = 0;
};
void from_json(const nlohmann::json& j, Invoice& i) {
  j.at("customer").get_to(i.customer);
  j.at("cents").get_to(i.cents);
}

class Queue : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = unique_schema(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto conn = baton::detail::connect({.url = database_url(), .schema = schema_});
    baton::detail::migrate(*conn, schema_);
    db_ = connect(schema_);
  }
  long long count(const std::string& sql) { return query_int(*db_, sql); }
  bool wait_count(const std::string& sql, long long want, std::chrono::milliseconds timeout = 20s) {
    return wait_for([&] { return count(sql) == want; }, timeout);
  }

  std::string schema_;
  std::unique_ptr<pqxx::connection> db_;
};

TEST_F(Queue, AnEnqueuedJobRunsOnceAndMovesToHistoryWithItsTimings) {
  std::mutex m;
  std::vector<baton::Job> seen;
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle("record", [&](JobContext& ctx) {
      std::lock_guard lock(m);
      seen.push_back(ctx.job());
    });
  });
  Client client(database_url(), schema_);
  const auto id = client.enqueue("record", {{"n", 7}}, EnqueueOptions{.queue = "q1"});

  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 1)) << "job never reached history";
  {
    std::lock_guard lock(m);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].id, id);
    EXPECT_EQ(seen[0].queue, "q1");
    EXPECT_EQ(nlohmann::json::parse(seen[0].payload)["n"], 7);
    EXPECT_EQ(seen[0].attempt, 1);
    EXPECT_EQ(seen[0].epoch, n.node().epoch());
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0) << "a finished job leaves the live queue";
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id) +
                  " AND outcome = 'completed' AND attempts = 1 AND node = 'solo'"
                  " AND run_seconds >= 0 AND created_at <= first_started_at"
                  " AND first_started_at <= finished_at AND queue = 'q1' AND type = 'record'"),
            1);
}

TEST_F(Queue, AThrowingHandlerIsRetriedWithBackoffThenDeadLettered) {
  std::atomic<int> calls{0};
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle("smtp", [&](JobContext& ctx) {
      ++calls;
      throw std::runtime_error("smtp down on attempt " + std::to_string(ctx.job().attempt));
    });
  });
  Client client(database_url(), schema_);
  const auto id = client.enqueue("smtp", {}, EnqueueOptions{.max_attempts = 3});

  ASSERT_TRUE(wait_count("SELECT count(*) FROM dead_jobs", 1)) << "job never dead-lettered";
  EXPECT_EQ(calls.load(), 3);
  pqxx::nontransaction tx(*db_);
  auto r = tx.exec_params(
      "SELECT attempts, reason, last_error, jsonb_array_length(errors), errors->0->>'error' "
      "FROM dead_jobs WHERE id = $1",
      id);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0][0].as<int>(), 3);
  EXPECT_STREQ(r[0][1].c_str(), "exhausted");
  EXPECT_STREQ(r[0][2].c_str(), "smtp down on attempt 3");
  EXPECT_EQ(r[0][3].as<int>(), 3) << "every attempt's error is kept";
  EXPECT_STREQ(r[0][4].c_str(), "smtp down on attempt 1");
  EXPECT_EQ(tx.exec("SELECT count(*) FROM jobs")[0][0].as<int>(), 0);
  EXPECT_EQ(tx.exec("SELECT count(*) FROM job_history")[0][0].as<int>(), 0);
}

TEST_F(Queue, AJobThatFailsOnceSucceedsOnItsSecondAttempt) {
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle("flaky", [&](JobContext& ctx) {
      if (ctx.job().attempt == 1) throw std::runtime_error("transient");
    });
  });
  Client client(database_url(), schema_);
  const auto id = client.enqueue("flaky", {});
  ASSERT_TRUE(wait_count(
      "SELECT count(*) FROM job_history WHERE attempts = 2 AND id = " + std::to_string(id), 1));
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs"), 0);
}

TEST_F(Queue, UnknownTypesAndUnmappablePayloadsDieAtOnceWithAClearError) {
  std::atomic<int> invoices{0};
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle<Invoice>("invoice", [&](JobContext&, const Invoice& i) {
      EXPECT_EQ(i.customer, "acme");
      ++invoices;
    });
  });
  Client client(database_url(), schema_);
  client.enqueue("invoice", {{"customer", "acme"}, {"cents", 100}});
  const auto bad = client.enqueue("invoice", {{"customer", "acme"}});  // no cents
  const auto unknown = client.enqueue("no_such_type", {});

  ASSERT_TRUE(wait_count("SELECT count(*) FROM dead_jobs", 2));
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 1));
  EXPECT_EQ(invoices.load(), 1);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE attempts = 1 AND reason = 'bad_payload'"
                  " AND last_error LIKE '%cents%' AND id = " +
                  std::to_string(bad)),
            1);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE attempts = 1 AND reason = 'unknown_type'"
                  " AND last_error LIKE '%no_such_type%node.handle%' AND id = " +
                  std::to_string(unknown)),
            1);
}

TEST_F(Queue, TheClientRefusesBadInputAndInsertsNothing) {
  Client client(database_url(), schema_);
  EXPECT_THROW(client.enqueue("t", {}, EnqueueOptions{.queue = "bad queue"}), baton::EnqueueError);
  EXPECT_THROW(client.enqueue("x'; DROP TABLE jobs; --", {}), baton::EnqueueError);
  EXPECT_THROW(client.enqueue("t", {}, EnqueueOptions{.max_attempts = 0}), baton::EnqueueError);
  EXPECT_THROW(client.enqueue("t", {}, EnqueueOptions{.priority = 40000}), baton::EnqueueError);
  try {
    client.enqueue("t", {{"blob", std::string(2 << 20, 'x')}});
    ADD_FAILURE() << "accepted a 2 MiB payload";
  } catch (const baton::EnqueueError& e) {
    EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM pg_tables WHERE tablename = 'jobs' AND schemaname = '" +
                  schema_ + "'"),
            1);
}

TEST_F(Queue, BatchEnqueueArrivesWholeAndInOrder) {
  Client client(database_url(), schema_);
  const auto copies = client.enqueue_copies("noop", {{"k", 1}}, 10000);
  EXPECT_EQ(copies.size(), 10000u);
  std::vector<nlohmann::json> payloads;
  for (int i = 0; i < 1000; ++i)
    payloads.push_back({{"i", i}});
  const auto ids = client.enqueue_many("noop", payloads, EnqueueOptions{.queue = "many"});
  ASSERT_EQ(ids.size(), 1000u);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 11000);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE queue = 'many' AND (payload->>'i')::bigint = "
                  "id - " +
                  std::to_string(ids.front())),
            1000)
      << "payload i lands on the i-th id";
}

TEST_F(Queue, OnlyTheLeaderRunsJobs) {
  std::mutex m;
  std::set<std::string> ran_on;
  auto setup_for = [&](const std::string& name) {
    return [&, name](Node& node) {
      node.handle("where", [&, name](JobContext&) {
        std::lock_guard lock(m);
        ran_on.insert(name);
      });
    };
  };
  RunningNode a(test_config(schema_, "a"), setup_for("a"));
  RunningNode b(test_config(schema_, "b"), setup_for("b"));
  ASSERT_TRUE(wait_for([&] { return a.node().is_leader() || b.node().is_leader(); }, 10s));
  EXPECT_FALSE(a.node().is_leader() && b.node().is_leader());
  const std::string leader = a.node().is_leader() ? "a" : "b";
  Client client(database_url(), schema_);
  client.enqueue_copies("where", {}, 200);
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 200));
  EXPECT_EQ(ran_on, std::set<std::string>{leader});
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE node <> '" + leader + "'"), 0);
}

}  // namespace
