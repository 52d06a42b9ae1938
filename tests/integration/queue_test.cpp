// The queue end to end against a real PostgreSQL, with a node running in this process.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "baton/admin.h"
#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/node_runner.h"
#include "support/schema_test.h"
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

class Queue : public SchemaTest {};

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

TEST_F(Queue, UnmappablePayloadsDieAtOnceAndUnknownTypesWaitForALeaderThatHandlesThem) {
  std::atomic<int> invoices{0};
  Client client(database_url(), schema_);
  std::int64_t unknown = 0;
  {
    // The old version of the application: it has no handler for "receipt" yet.
    RunningNode n(test_config(schema_, "old"), [&](Node& node) {
      node.handle<Invoice>("invoice", [&](JobContext&, const Invoice& i) {
        EXPECT_EQ(i.customer, "acme");
        ++invoices;
      });
    });
    client.enqueue("invoice", {{"customer", "acme"}, {"cents", 100}});
    const auto bad = client.enqueue("invoice", {{"customer", "acme"}});  // no cents
    unknown = client.enqueue("receipt", {});
    ASSERT_TRUE(wait_count("SELECT count(*) FROM dead_jobs", 1));
    ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 1));
    EXPECT_EQ(invoices.load(), 1);
    EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE attempts = 1 AND reason = 'bad_payload'"
                    " AND last_error LIKE '%cents%' AND id = " +
                    std::to_string(bad)),
              1);
    // The receipt waits, untouched: a rolling deploy must not dead-letter the new type's jobs.
    ASSERT_TRUE(wait_for([&] { return n.node().is_leader(); }, 10s));
    EXPECT_EQ(
        count("SELECT count(*) FROM jobs WHERE state = 'available' AND attempts = 0 AND id = " +
              std::to_string(unknown)),
        1);
  }
  // The new version leads: the receipt runs.
  std::atomic<int> receipts{0};
  RunningNode n(test_config(schema_, "new"),
                [&](Node& node) { node.handle("receipt", [&](JobContext&) { ++receipts; }); });
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(unknown), 1));
  EXPECT_EQ(receipts.load(), 1);
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

namespace {

using namespace baton::test;
using baton::Client;
using baton::EnqueueOptions;
using baton::JobContext;
using baton::NewJob;
using baton::Node;

class Producers : public SchemaTest {};

TEST_F(Producers, AJobEnqueuedInTheCallersTransactionExistsOnlyIfItCommits) {
  pqxx::connection app(database_url());  // the application's own connection, default search_path
  {
    pqxx::work tx(app);
    tx.exec("CREATE TEMP TABLE orders (id int)");
    tx.exec("INSERT INTO orders VALUES (1)");
    baton::enqueue_in(tx, {NewJob{"ship", {{"order", 1}}, {}}}, {.schema = schema_});
    tx.abort();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0) << "a rolled-back enqueue left a job";
  {
    pqxx::work tx(app);
    const auto ids =
        baton::enqueue_in(tx, {NewJob{"ship", {{"order", 2}}, {}}}, {.schema = schema_});
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0) << "visible before the commit";
    tx.commit();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE payload->>'order' = '2'"), 1);
}

TEST_F(Producers, OneJobIsStoredAsInABatchWithEveryOption) {
  // A single job goes to baton.enqueue, a batch to enqueue_columns: the rows must not differ.
  {
    pqxx::nontransaction(*db_).exec(
        "INSERT INTO queue_state (queue, partitions) VALUES ('mail', 4)");
  }
  Client client(database_url(), schema_);
  EnqueueOptions o;
  o.queue = "mail";
  o.priority = -7;
  o.run_at = std::chrono::system_clock::time_point(std::chrono::microseconds(1893456000123456));
  o.max_attempts = 3;
  o.partition_key = "customer-9";
  o.timeout = std::chrono::milliseconds(2500);
  const nlohmann::json payload = {{"to", "ada@example.com"}, {"n", 1.5}};
  const auto one = client.enqueue_batch({{"send", payload, o}});
  const auto two = client.enqueue_batch({{"send", payload, o}, {"send", payload, o}});
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(two.size(), 2u);
  const std::string row =
      "SELECT row(queue, type, payload, priority, run_at, max_attempts, partition_key, partition, "
      "timeout_ms, shard, idempotency_key)::text FROM jobs WHERE id = ";
  const auto single = query_value(*db_, row + std::to_string(one[0]));
  EXPECT_EQ(single, query_value(*db_, row + std::to_string(two[0])));
  EXPECT_EQ(single, query_value(*db_, row + std::to_string(two[1])));
  EXPECT_EQ(query_value(*db_,
                        "SELECT (extract(epoch FROM run_at) * 1000000)::bigint FROM jobs "
                        "WHERE id = " +
                            std::to_string(one[0])),
            "1893456000123456");
  // A delay, and a run_at before 1970 with a fraction, each alone and in a batch.
  const auto since_created = [&](std::int64_t id) {
    return query_value(*db_,
                       "SELECT (extract(epoch FROM run_at - created_at) * 1000)::bigint "
                       "FROM jobs WHERE id = " +
                           std::to_string(id));
  };
  const auto epoch_us = [&](std::int64_t id) {
    return query_value(*db_,
                       "SELECT (extract(epoch FROM run_at) * 1000000)::bigint FROM jobs "
                       "WHERE id = " +
                           std::to_string(id));
  };
  EnqueueOptions later;
  later.delay = std::chrono::seconds(90);
  EXPECT_EQ(since_created(client.enqueue_batch({{"send", payload, later}})[0]), "90000");
  EXPECT_EQ(
      since_created(client.enqueue_batch({{"send", payload, later}, {"send", payload, later}})[1]),
      "90000");
  EnqueueOptions past;
  past.run_at = std::chrono::system_clock::time_point(std::chrono::microseconds(-1500000));
  EXPECT_EQ(epoch_us(client.enqueue_batch({{"send", payload, past}})[0]), "-1500000");
  EXPECT_EQ(epoch_us(client.enqueue_batch({{"send", payload, past}, {"send", payload, past}})[1]),
            "-1500000");
}

TEST_F(Producers, ABatchAcrossQueuesPartitionsEachJobByItsOwnQueueAndKeepsItsOrder) {
  // Queues with 4 and 3 partitions and one without a row in queue_state; partition keys and
  // idempotency keys on some jobs only, interleaved.
  pqxx::nontransaction(*db_).exec(
      "INSERT INTO queue_state (queue, partitions) VALUES ('mail', 4), ('sms', 3)");
  const std::vector<std::string> queues = {"mail", "sms", "plain"};
  std::vector<NewJob> jobs;
  for (int i = 0; i < 60; ++i) {
    EnqueueOptions o;
    o.queue = queues[static_cast<std::size_t>(i % 3)];
    if (i % 2 == 1) o.partition_key = "customer-" + std::to_string(i);
    if (i % 5 == 0) o.idempotency_key = "order-" + std::to_string(i);
    jobs.push_back({"send", {{"i", i}}, o});
  }
  Client client(database_url(), schema_);
  const auto ids = client.enqueue_batch(jobs);
  ASSERT_EQ(ids.size(), 60U);
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(count("SELECT count(*) FROM (SELECT (payload->>'i')::int AS i, "
                  "row_number() OVER (ORDER BY id) - 1 AS r FROM jobs) x WHERE x.i = x.r"),
            60)
      << "ids follow the jobs' order";
  EXPECT_EQ(count("SELECT count(*) FROM jobs "
                  "WHERE partition IS NOT DISTINCT FROM job_partition(queue, partition_key)"),
            60)
      << "each job's partition is that of its own queue";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE partition IS NOT NULL"), 20)
      << "the keyed jobs of mail and sms have a partition, the others none";
  EXPECT_GT(count("SELECT count(*) FROM jobs WHERE queue = 'sms' "
                  "AND partition <> partition_of(partition_key, 4)"),
            0)
      << "the keys must land apart under 3 and 4 partitions, or the check above proves nothing";
}

TEST_F(Producers, AnIdempotencyKeyDedupesWhileTheJobIsLive) {
  Client client(database_url(), schema_);
  EnqueueOptions o;
  o.idempotency_key = "invoice-42";
  const auto first = client.enqueue("bill", {{"n", 1}}, o);
  const auto again = client.enqueue("bill", {{"n", 2}}, o);
  EXPECT_EQ(again, first);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 1);
  EXPECT_EQ(count("SELECT (payload->>'n')::int FROM jobs"), 1) << "the first job is kept";
  o.queue = "other";
  EXPECT_NE(client.enqueue("bill", {}, o), first) << "keys are per queue";
  // Once the job has finished, the key is free again.
  RunningNode n(test_config(schema_, "solo"),
                [](Node& node) { node.handle("bill", [](JobContext&) {}); });
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 2));
  o.queue = "default";
  EXPECT_NE(client.enqueue("bill", {}, o), first);
}

TEST_F(Producers, BackoffSchedulesTheNextRunWithinTheJitterBoundsAndRetryInIsExact) {
  RunningNode n(test_config(schema_, "solo"), [](Node& node) {
    node.handle("flaky", [](JobContext&) { throw std::runtime_error("down"); },
                {.retry_base = 10s, .retry_cap = 1h, .retry_factor = 3.0});
    node.handle("later", [](JobContext&) { throw baton::RetryIn(1500ms, "not yet"); });
  });
  Client client(database_url(), schema_);
  for (int i = 0; i < 20; ++i)
    client.enqueue("flaky", {});
  client.enqueue("later", {});
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM jobs WHERE attempts = 1 AND state = 'available' "
                 "AND jsonb_array_length(errors) = 1",
                 21));
  // The delay is run_at minus the time the failure was recorded (one transaction, one now()).
  const std::string delay = "extract(epoch FROM run_at - (errors->0->>'at')::timestamptz)";
  EXPECT_EQ(
      count("SELECT count(*) FROM jobs WHERE type = 'flaky' AND " + delay + " BETWEEN 5 AND 10"),
      20)
      << "attempt 1 of base 10 s waits in [5 s, 10 s]";
  EXPECT_GT(count("SELECT count(DISTINCT round(" + delay +
                  "::numeric, 2)) FROM jobs WHERE "
                  "type = 'flaky'"),
            5)
      << "no jitter";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE type = 'later' AND abs(" + delay +
                  " - 1.5) < 0.001 AND last_error = 'not yet'"),
            1);
}

TEST_F(Producers, AnOrderedPartitionRunsInOrderOneAtATimeEvenThroughFailures) {
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("INSERT INTO queue_state (queue, partitions) VALUES ('sms', 4)");
  }
  std::mutex m;
  std::map<std::string, std::vector<int>> order;
  std::map<std::string, int> running;
  int overlap = 0, most_at_once = 0, busy = 0;
  auto config = test_config(schema_, "solo");
  config.threads = 8;
  RunningNode n(config, [&](Node& node) {
    node.handle("send",
                [&](JobContext& ctx) {
                  const auto p = ctx.payload();
                  const std::string to = p["to"];
                  {
                    std::lock_guard lock(m);
                    if (++running[to] > 1) ++overlap;
                    most_at_once = std::max(most_at_once, ++busy);
                  }
                  std::this_thread::sleep_for(15ms);
                  std::lock_guard lock(m);
                  --running[to];
                  --busy;
                  // The fourth message to +100 fails once: it must hold its partition until it
                  // succeeds.
                  if (to == "+100" && p["seq"] == 3 && ctx.job().attempt == 1) {
                    throw std::runtime_error("carrier busy");
                  }
                  order[to].push_back(p["seq"]);
                },
                {.retry_base = 100ms, .retry_cap = 100ms});
  });
  std::vector<NewJob> batch;
  for (int seq = 0; seq < 10; ++seq) {
    for (const char* to : {"+100", "+200", "+300", "+400", "+500"}) {
      EnqueueOptions o;
      o.queue = "sms";
      o.partition_key = to;
      batch.push_back(NewJob{"send", {{"to", to}, {"seq", seq}}, o});
    }
  }
  Client(database_url(), schema_).enqueue_batch(batch);
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 50));
  std::lock_guard lock(m);
  EXPECT_EQ(overlap, 0) << "two jobs of one partition ran at once";
  for (const auto& [to, seqs] : order) {
    EXPECT_EQ(seqs, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << to;
  }
  EXPECT_GT(most_at_once, 1) << "different partitions run in parallel";
}

TEST_F(Producers, ATransactionalHandlersWritesRollBackWhenItFails) {
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE TABLE ledger (job_id bigint)");
  }
  RunningNode n(test_config(schema_, "solo"), [](Node& node) {
    node.handle_tx("post", [](JobContext& ctx, pqxx::work& tx) {
      tx.exec_params("INSERT INTO ledger VALUES ($1)", ctx.job().id);
      if (ctx.payload().value("fail", false)) throw std::runtime_error("rejected");
    });
  });
  Client client(database_url(), schema_);
  const auto bad = client.enqueue("post", {{"fail", true}}, {.max_attempts = 2});
  const auto good = client.enqueue("post", nlohmann::json::object());
  ASSERT_TRUE(wait_count("SELECT count(*) FROM dead_jobs", 1));
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 1));
  EXPECT_EQ(count("SELECT count(*) FROM ledger WHERE job_id = " + std::to_string(bad)), 0);
  EXPECT_EQ(count("SELECT count(*) FROM ledger WHERE job_id = " + std::to_string(good)), 1);
}

TEST_F(Producers, ABatchOfAHundredThousandArrivesWhole) {
  Client client(database_url(), schema_);
  std::vector<nlohmann::json> payloads;
  payloads.reserve(100'000);
  for (int i = 0; i < 100'000; ++i)
    payloads.push_back({{"i", i}});
  const auto ids = client.enqueue_many("noop", payloads);
  ASSERT_EQ(ids.size(), 100'000u);
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 100'000);
  EXPECT_EQ(count("SELECT count(DISTINCT payload->>'i') FROM jobs"), 100'000);
}

TEST_F(Producers, ThePayloadLimitIsConfigurable) {
  Client client(database_url(), baton::ClientOptions{.schema = schema_, .max_payload_bytes = 100});
  EXPECT_NO_THROW(client.enqueue("t", {{"s", std::string(50, 'x')}}));
  try {
    client.enqueue("t", {{"s", std::string(200, 'x')}});
    ADD_FAILURE() << "accepted a payload over the limit";
  } catch (const baton::EnqueueError& e) {
    EXPECT_NE(std::string(e.what()).find("the limit is 100 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 1);
}

}  // namespace

namespace {

using namespace baton::test;

TEST_F(Queue, TheClientCancelsJobsAndAsksTheirStatus) {
  std::atomic<bool> saw_cancel{false};
  std::atomic<bool> started{false};
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle("wait", [&](JobContext& ctx) {
      started = true;
      const auto until = std::chrono::steady_clock::now() + 20s;
      while (!ctx.cancelled() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(5ms);
      saw_cancel = ctx.cancel_requested();
      if (ctx.cancelled()) throw std::runtime_error("stopped: cancelled");
    });
  });
  Client client(database_url(), schema_);
  const auto later =
      client.enqueue("wait", {}, {.delay = std::chrono::hours(1), .idempotency_key = "k-later"});
  EXPECT_EQ(client.status(later)->status, "scheduled");
  EXPECT_EQ(client.status("default", "k-later")->id, later);
  EXPECT_EQ(client.cancel(later), baton::CancelResult::cancelled);
  EXPECT_EQ(client.status(later)->status, "cancelled");
  EXPECT_EQ(client.cancel(later), baton::CancelResult::finished);
  EXPECT_EQ(client.cancel(424242), baton::CancelResult::not_found);
  EXPECT_FALSE(client.status(424242).has_value());

  const auto running = client.enqueue("wait", {}, {.idempotency_key = "k-now"});
  // Claimed ("running") comes before the handler starts; a job cancelled in between ends
  // without its handler, which is not what this part asks.
  ASSERT_TRUE(wait_for([&] { return started.load(); }, 20s));
  ASSERT_EQ(client.status(running)->status, "running");
  EXPECT_EQ(client.cancel("default", "k-now"), baton::CancelResult::cancelling);
  EXPECT_EQ(client.status(running)->status, "cancelling");
  ASSERT_TRUE(wait_for([&] { return client.status(running)->status == "cancelled"; }, 20s));
  EXPECT_TRUE(saw_cancel.load()) << "the handler did not see its job's cancellation";
  EXPECT_EQ(client.status(running)->last_error, "stopped: cancelled");
  EXPECT_EQ(client.status("default", "k-now")->id, running) << "found by key after it finished";
}

TEST_F(Queue, AnAdminMadeFromAURLActsWithoutSessionSettingsAndOutlivesItsSession) {
  // An Admin from a URL (an operator's own tool, long-lived) names the schema in every
  // statement, as a Client does: its session has no search_path of baton's, and when the server
  // ends the session, a later call opens a new one by itself.
  baton::Admin admin(database_url(), schema_, "ops-tool");
  EXPECT_FALSE(admin.set_paused("q-admin", true)) << "a queue never seen is reported as such";
  EXPECT_EQ(count("SELECT count(*) FROM queue_state WHERE queue = 'q-admin' AND paused AND "
                  "updated_by = 'ops-tool'"),
            1);
  // Every other action, once, in a session without baton's search_path.
  admin.declare_ordered("q-admin", 4);
  EXPECT_EQ(count("SELECT partitions FROM queue_state WHERE queue = 'q-admin'"), 4);
  EXPECT_FALSE(admin.retry_dead(424242));
  EXPECT_EQ(admin.retry_dead_all(), 0);
  EXPECT_FALSE(admin.discard_dead(424242));
  EXPECT_EQ(admin.purge_dead(std::chrono::hours(1)), 0);
  EXPECT_EQ(admin.cancel(424242), baton::CancelResult::not_found);
  const auto request = admin.request_step_down("*", "drill");
  EXPECT_EQ(count("SELECT count(*) FROM control_requests WHERE id = " + std::to_string(request) +
                  " AND note = 'drill'"),
            1);

  count(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
      "WHERE application_name = 'ops-tool'");
  ASSERT_TRUE(wait_count(
      "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ops-tool'", 0, 10s));
  // The first call finds the session gone; one of the next ones runs in a new session.
  bool resumed = false;
  for (int call = 1; call <= 5 && !resumed; ++call) {
    try {
      admin.set_paused("q-admin", false);
      resumed = true;
    } catch (const std::exception& e) {
      EXPECT_TRUE(baton::detail::is_connection_error(e)) << "call " << call << ": " << e.what();
    }
  }
  ASSERT_TRUE(resumed) << "the Admin did not come back after its session ended";
  EXPECT_EQ(count("SELECT count(*) FROM queue_state WHERE queue = 'q-admin' AND NOT paused"), 1);
}

TEST_F(Queue, AClientOutlivesItsSession) {
  // A producer's Client keeps working after the server ended its session (a restart, a
  // failover): the next call fails with a connection error, and a later one opens a new session.
  Client client(database_url(), schema_);
  client.enqueue("t", {{"n", 1}});
  // Its session: the last statement named this test's schema.
  const std::string mine =
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
      "application_name = 'baton-client' AND pid <> pg_backend_pid() AND "
      "strpos(query, '" +
      schema_ + "') > 0";
  ASSERT_EQ(count(mine), 1);
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                 "'baton-client' AND strpos(query, '" +
                     schema_ + "') > 0",
                 0, 10s));
  std::int64_t id = 0;
  for (int call = 1; call <= 5 && id == 0; ++call) {
    try {
      id = client.enqueue("t", {{"n", 2}});
    } catch (const std::exception& e) {
      EXPECT_TRUE(baton::detail::is_connection_error(e)) << "call " << call << ": " << e.what();
    }
  }
  ASSERT_NE(id, 0) << "the Client did not come back after its session ended";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE payload = '{\"n\": 2}'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 2);
}

}  // namespace
