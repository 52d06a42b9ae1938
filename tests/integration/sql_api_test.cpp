// The SQL API (sql/0004_sql_api.sql) against a real PostgreSQL: what producers in any language
// rely on, including a Node.js script with the pg package and a role allowed only to EXECUTE.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <thread>

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

class SqlApi : public SchemaTest {
 protected:
  // The SQLSTATE and message of a statement that must fail.
  std::pair<std::string, std::string> error_of(const std::string& sql) {
    try {
      pqxx::nontransaction tx(*db_);
      tx.exec(sql);
    } catch (const pqxx::sql_error& e) {
      return {e.sqlstate(), e.what()};
    }
    return {"", "no error"};
  }
  // A login role named after the test, with USAGE on the schema and the grants of `grants`
  // (statements with @role in place of its name); returns its connection string.
  std::string role_url(const std::string& suffix, const std::vector<std::string>& grants) {
    const std::string role = schema_.substr(0, 40) + "_" + suffix;
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE ROLE " + role + " LOGIN");
    tx.exec("GRANT USAGE ON SCHEMA " + schema_ + " TO " + role);
    for (auto grant : grants)
      tx.exec(grant.replace(grant.find("@role"), 5, role));
    auto url = baton::describe_database_url(database_url());
    return url.substr(0, url.find(" user=")) + " user=" + role;
  }
  static constexpr const char* kNineArguments =
      "enqueue(text, text, jsonb, int, timestamptz, int, text, text, int)";
};

TEST_F(SqlApi, AJobEnqueuedInSqlIsProcessedByARunningNode) {
  std::atomic<int> seen{0};
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle("greet", [&](JobContext& ctx) {
      if (ctx.payload()["name"] == "ada") ++seen;
    });
  });
  const auto id = count(
      "SELECT enqueue('default', 'greet', '{\"name\": \"ada\"}', priority => 5, "
      "max_attempts => 3)");
  ASSERT_TRUE(wait_for(
      [&] {
        return count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id)) == 1;
      },
      20s));
  EXPECT_EQ(seen.load(), 1);
  EXPECT_EQ(count("SELECT priority FROM job_history"), 5);
}

TEST_F(SqlApi, BadArgumentsRaiseDocumentedSqlstatesWithTheFix) {
  auto [state, message] = error_of("SELECT enqueue('bad queue', 't')");
  EXPECT_EQ(state, "BT001");
  EXPECT_NE(message.find("queue name 'bad queue' is not allowed"), std::string::npos) << message;
  std::tie(state, message) = error_of("SELECT enqueue('q', 'x''; DROP TABLE jobs; --')");
  EXPECT_EQ(state, "BT001") << message;
  std::tie(state, message) = error_of("SELECT enqueue('q', 't', priority => 99999)");
  EXPECT_EQ(state, "BT003");
  EXPECT_NE(message.find("priority 99999 is out of range"), std::string::npos) << message;
  std::tie(state, message) = error_of("SELECT enqueue('q', 't', max_attempts => 0)");
  EXPECT_EQ(state, "BT003") << message;
  std::tie(state, message) = error_of("SELECT enqueue('q', 't', timeout_ms => -5)");
  EXPECT_EQ(state, "BT003") << message;
  // Each limit, one past it and on it: enqueue tests them all at once before it names one.
  for (const char* args : {"priority => -32769", "priority => 32768", "max_attempts => 1001",
                           "timeout_ms => 2000000001", "partition_key => repeat('k', 257)",
                           "idempotency_key => repeat('k', 257)"}) {
    std::tie(state, message) = error_of(std::string("SELECT enqueue('q', 't', ") + args + ")");
    EXPECT_EQ(state, "BT003") << args << ": " << message;
  }
  EXPECT_GT(count("SELECT enqueue('q', 't', priority => -32768, max_attempts => 1000, "
                  "timeout_ms => 2000000000, partition_key => repeat('k', 256), "
                  "idempotency_key => repeat('k', 256))"),
            0);
  pqxx::nontransaction(*db_).exec("DELETE FROM jobs");
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("UPDATE settings SET value = '64' WHERE key = 'max_payload_bytes'");
  }
  std::tie(state, message) =
      error_of("SELECT enqueue('q', 't', jsonb_build_object('s', repeat('x', 100)))");
  EXPECT_EQ(state, "BT002");
  EXPECT_NE(message.find("the limit is 64 bytes"), std::string::npos) << message;
  std::tie(state, message) = error_of("SELECT enqueue_many('{\"not\": \"an array\"}')");
  EXPECT_EQ(state, "BT003") << message;
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0) << "a refused enqueue inserts nothing";
}

TEST_F(SqlApi, AJobWithoutKeysGetsTheSameRowAndLimitsAsAJobWithOne) {
  // enqueue takes a job with no partition or idempotency key, whose checks pass, by a shorter
  // path (migration 0017). Beside each such job goes one with an idempotency key, the rest the
  // same, through the full path: both rows must match but for the key, on every limit and NULL.
  const char* cases[] = {
      "'{\"a\": 1}', 7, '2030-01-02 03:04:05+00', 3, NULL, ",
      "NULL, NULL, NULL, NULL, NULL, ",
      "'[]', -32768, now() + interval '1 day', 1, NULL, ",
      "'\"s\"', 32767, NULL, 1000, NULL, ",
  };
  const char* timeouts[] = {"1500", "NULL", "0", "2000000000"};
  const std::string columns =
      "(queue, type, payload, priority, run_at, max_attempts, timeout_ms, shard, partition, "
      "partition_key, state, attempts, claims, errors, created_at)::text";
  for (int i = 0; i < 4; ++i) {
    const std::string rest = std::string(cases[i]);
    pqxx::work tx(*db_);  // one transaction: now() is the same for both
    const auto ids = tx.exec("SELECT enqueue('q', 't', " + rest + "NULL, " + timeouts[i] +
                             "), enqueue('q', 't', " + rest + "'key-" + std::to_string(i) + "', " +
                             timeouts[i] + ")")[0];
    const auto row = [&](int keyed) {
      const auto found = tx.exec_params("SELECT " + columns + " FROM jobs WHERE id = $1 AND " +
                                            "idempotency_key IS " + (keyed ? "NOT NULL" : "NULL"),
                                        ids[keyed].as<long long>());
      return found.empty() ? std::string("missing") : found[0][0].as<std::string>();
    };
    const std::string common = row(0);
    EXPECT_EQ(common, row(1)) << cases[i] << timeouts[i];
    EXPECT_NE(common, "missing") << cases[i] << timeouts[i];
    tx.commit();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE timeout_ms IS NULL"), 4)
      << "0 and NULL are no timeout";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE priority = 0 AND max_attempts = 10 AND "
                  "payload = '{}'"),
            2)
      << "NULLs take the defaults";
  // The payload limit, on it and one byte past it, without keys.
  pqxx::nontransaction(*db_).exec(
      "UPDATE settings SET value = '64' WHERE key = 'max_payload_bytes'");
  const std::string on_limit = "jsonb_build_object('s', repeat('x', 55))";  // {"s": "x…"}: 64
  EXPECT_GT(count("SELECT enqueue('q', 't', " + on_limit + ")"), 0);
  auto [state, message] =
      error_of("SELECT enqueue('q', 't', jsonb_build_object('s', repeat('x', 56)))");
  EXPECT_EQ(state, "BT002") << message;
  EXPECT_NE(message.find("payload is 65 bytes; the limit is 64 bytes"), std::string::npos)
      << message;
}

TEST_F(SqlApi, ASettingsChangeReachesSessionsThatAlreadyEnqueuedAndABadValueIsRefused) {
  // enqueue reads the payload limit as a constant that a trigger on settings rewrites: a
  // producer's session with the old plan cached must see every change at its next call.
  auto producer = connect(schema_);
  const std::string big = "SELECT enqueue('q', 't', jsonb_build_object('s', repeat('x', 100)))";
  auto enqueue_big = [&]() -> std::string {
    try {
      pqxx::nontransaction tx(*producer);
      tx.exec(big);
    } catch (const pqxx::sql_error& e) {
      return e.sqlstate() + " " + e.what();
    }
    return "accepted";
  };
  ASSERT_EQ(enqueue_big(), "accepted");
  ASSERT_EQ(enqueue_big(), "accepted");  // its plans are cached now
  pqxx::nontransaction(*db_).exec(
      "UPDATE settings SET value = '64' WHERE key = 'max_payload_bytes'");
  auto refused = enqueue_big();
  EXPECT_EQ(refused.substr(0, 6), "BT002 ") << refused;
  EXPECT_NE(refused.find("the limit is 64 bytes"), std::string::npos) << refused;

  // A value enqueue could not use is refused when it is written, and the old one stays.
  auto [state, message] =
      error_of("UPDATE settings SET value = '1 MiB' WHERE key = 'max_payload_bytes'");
  EXPECT_EQ(state, "BT003") << message;
  EXPECT_NE(message.find("max_payload_bytes '1 MiB'"), std::string::npos) << message;
  EXPECT_EQ(count("SELECT value::bigint FROM settings WHERE key = 'max_payload_bytes'"), 64);
  std::tie(state, message) =
      error_of("UPDATE settings SET value = '-1' WHERE key = 'max_payload_bytes'");
  EXPECT_EQ(state, "BT003") << message;
  // A writer whose snapshot is older than its statement could miss another writer's change.
  std::tie(state, message) = error_of(
      "BEGIN ISOLATION LEVEL REPEATABLE READ; "
      "UPDATE settings SET value = '128' WHERE key = 'max_payload_bytes'; COMMIT");
  EXPECT_EQ(state, "0A000") << message;
  pqxx::nontransaction(*db_).exec("ROLLBACK");
  EXPECT_EQ(count("SELECT value::bigint FROM settings WHERE key = 'max_payload_bytes'"), 64);
  refused = enqueue_big();
  EXPECT_NE(refused.find("the limit is 64 bytes"), std::string::npos) << refused;

  // No row, no limit (as before the limit was a constant); back again, the limit is back.
  pqxx::nontransaction(*db_).exec("DELETE FROM settings WHERE key = 'max_payload_bytes'");
  EXPECT_EQ(enqueue_big(), "accepted");
  pqxx::nontransaction(*db_).exec("INSERT INTO settings VALUES ('max_payload_bytes', '80')");
  refused = enqueue_big();
  EXPECT_NE(refused.find("the limit is 80 bytes"), std::string::npos) << refused;
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 3) << "only the accepted calls inserted";
}

TEST_F(SqlApi, AShardCountChangeReachesEnqueueAndAPartitionFollowsItInAnOpenTransaction) {
  // A job without a partition key takes the count as a constant, rewritten with settings; one
  // with a key reads the table, so that a transaction begun before set_shards cannot split an
  // ordered partition over two counts.
  ASSERT_NE(count("SELECT shard_of('order-7', 4)"), 0) << "the key must move when the count does";
  auto producer = connect(schema_);
  pqxx::work open(*producer);
  open.exec("SELECT enqueue('q', 't')");  // plans cached, the transaction open
  pqxx::nontransaction(*db_).exec("SELECT set_shards(4)");
  const auto keyed =
      open.exec("SELECT enqueue('q', 't', partition_key => 'order-7')")[0][0].as<long long>();
  open.commit();
  EXPECT_EQ(count("SELECT shard FROM jobs WHERE id = " + std::to_string(keyed)),
            count("SELECT shard_of('order-7', 4)"));
  // From its next transaction on, jobs without a key spread over the four shards.
  pqxx::nontransaction(*producer).exec("SELECT enqueue('q', 't') FROM generate_series(1, 200)");
  EXPECT_EQ(count("SELECT count(DISTINCT shard) FROM jobs WHERE partition_key IS NULL AND id > " +
                  std::to_string(keyed)),
            4);
}

TEST_F(SqlApi, TheColumnsEnqueueFollowsSettingsChangesAndKeepsIdempotency) {
  // enqueue_columns (the C++ Client's batches) in a session whose plans are cached: a payload
  // limit changed meanwhile applies at its next call, a partition follows the shard count of
  // the moment even in a transaction begun before set_shards, and a live key is enqueued once.
  // $1 jobs of payload $2, each with partition key $3 and idempotency key $4 (NULL: none).
  const std::string sql =
      "SELECT count(*) FROM enqueue_columns(array_fill('q'::text, ARRAY[$1::int]), "
      "array_fill('t'::text, ARRAY[$1::int]), (SELECT jsonb_agg($2::jsonb) FROM generate_series(1, "
      "$1::int)), array_fill(0, ARRAY[$1::int]), array_fill(0::bigint, ARRAY[$1::int]), "
      "array_fill(10, "
      "ARRAY[$1::int]), array_fill(NULL::timestamptz, ARRAY[$1::int]), array_fill($3::text, "
      "ARRAY[$1::int]), "
      "array_fill($4::text, ARRAY[$1::int]), array_fill(0, ARRAY[$1::int]))";
  using Key = std::optional<std::string>;
  auto producer = connect(schema_);
  auto enqueue = [&](pqxx::transaction_base& tx, int n, const std::string& payload, Key pkey,
                     Key ikey) {
    return tx.exec_params(sql, n, payload, pkey, ikey)[0][0].as<int>();
  };
  ASSERT_NE(count("SELECT shard_of('order-7', 4)"), 0) << "the key must move when the count does";
  pqxx::work open(*producer);
  ASSERT_EQ(enqueue(open, 1, "{}", std::nullopt, std::nullopt), 1);  // plans cached, still open
  pqxx::nontransaction(*db_).exec("SELECT set_shards(4)");
  ASSERT_EQ(enqueue(open, 1, "{}", "order-7", std::nullopt), 1);
  open.commit();
  EXPECT_EQ(count("SELECT shard FROM jobs WHERE partition_key = 'order-7'"),
            count("SELECT shard_of('order-7', 4)"))
      << "a partition followed a shard count older than its transaction";
  {
    pqxx::nontransaction tx(*producer);
    ASSERT_EQ(enqueue(tx, 200, "{}", std::nullopt, std::nullopt), 200);
    EXPECT_EQ(enqueue(tx, 2, "{}", std::nullopt, "k1"), 1) << "a key is live once per batch";
    EXPECT_EQ(enqueue(tx, 1, "{}", std::nullopt, "k1"), 0) << "a live key enqueued again";
  }
  EXPECT_EQ(count("SELECT count(DISTINCT shard) FROM jobs WHERE partition_key IS NULL AND "
                  "idempotency_key IS NULL AND id > 2"),
            4)
      << "jobs without a key did not follow the new count";
  pqxx::nontransaction(*db_).exec(
      "UPDATE settings SET value = '64' WHERE key = 'max_payload_bytes'");
  std::string refused = "accepted";
  try {
    pqxx::nontransaction tx(*producer);
    enqueue(tx, 1, R"({"s": ")" + std::string(100, 'x') + R"("})", std::nullopt, std::nullopt);
  } catch (const pqxx::sql_error& e) {
    refused = e.sqlstate();
  }
  EXPECT_EQ(refused, "BT002") << "the producer's session kept the old payload limit";
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 203);
}

TEST_F(SqlApi, TheNameRuleIsTheSameInCppAndSql) {
  // The SQL rule is a regular expression: the names after "caf\xc3\xa9" are aimed at its anchors,
  // classes and escapes.
  for (const char* name : {"default",
                           "a",
                           "billing.v2",
                           "tenant:42",
                           "a-b_c",
                           "9lives",
                           "",
                           "_x",
                           "-x",
                           "has space",
                           "semi;colon",
                           "quote'd",
                           "caf\xc3\xa9",
                           "0123456789012345678901234567890123456789012345678901234567890123",
                           "01234567890123456789012345678901234567890123456789012345678901234",
                           "ends\n",
                           "\nstarts",
                           "new\nline",
                           "tab\tbed",
                           "[:alpha:]",
                           "x[:alpha:]",
                           "back\\slash",
                           "dollar$",
                           "x^y",
                           "x]",
                           "x.*",
                           "UPPER",
                           "Z9",
                           "x.",
                           "x:",
                           "x-",
                           "x_",
                           ".x",
                           ":x",
                           "x/y",
                           "\xef\xbc\xa1"}) {
    bool cpp_ok = true;
    try {
      baton::detail::validate_name("queue", name);
    } catch (const baton::EnqueueError&) {
      cpp_ok = false;
    }
    // check_name, and enqueue's own check of each of its two names.
    for (const char* sql : {"SELECT check_name('queue', $1)", "SELECT enqueue($1, 'noop')",
                            "SELECT enqueue('default', $1)"}) {
      pqxx::work tx(*db_);
      bool sql_ok = true;
      try {
        tx.exec_params(sql, std::string(name));
      } catch (const pqxx::sql_error& e) {
        EXPECT_STREQ(e.sqlstate().c_str(), "BT001") << sql << " '" << name << "': " << e.what();
        sql_ok = false;
      }
      EXPECT_EQ(cpp_ok, sql_ok) << sql << " '" << name << "'";
    }
  }
  // Both names bad: the queue's is the one reported.
  auto [state, message] = error_of("SELECT enqueue('bad queue', 'bad type')");
  EXPECT_EQ(state, "BT001");
  EXPECT_NE(message.find("queue name 'bad queue'"), std::string::npos) << message;
  std::tie(state, message) = error_of("SELECT enqueue('good', 'bad type')");
  EXPECT_NE(message.find("type name 'bad type'"), std::string::npos) << message;
  std::tie(state, message) = error_of("SELECT enqueue(NULL, 'noop')");
  EXPECT_EQ(state, "BT001") << message;
}

TEST_F(SqlApi, AnIdempotencyKeyReturnsTheLiveJob) {
  const auto first = count("SELECT enqueue('q', 't', idempotency_key => 'k1')");
  EXPECT_EQ(count("SELECT enqueue('q', 't', idempotency_key => 'k1')"), first);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 1);
}

TEST_F(SqlApi, EnqueueManyOfTenThousandArrivesWholeAndWakesTheLeaderOnce) {
  pqxx::connection listener(database_url());
  struct Counter : pqxx::notification_receiver {
    using pqxx::notification_receiver::notification_receiver;
    void operator()(const std::string&, int) override { ++count; }
    int count = 0;
  } wakeups(listener, schema_ + "_jobs");
  // As a sleeping leader does: hold the wake key of every queue.
  pqxx::nontransaction(listener).exec("SELECT pg_advisory_lock(hashtextextended(" +
                                      listener.quote(schema_ + "_jobs/*") + ", 0))");
  EXPECT_EQ(count("SELECT count(*) FROM enqueue_many((SELECT jsonb_agg(jsonb_build_object("
                  "'type', 'noop', 'payload', jsonb_build_object('i', i))) "
                  "FROM generate_series(1, 10000) i))"),
            10000);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 10000);
  // Another notification on the channel marks the end of what the batch sent.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("SELECT pg_notify(current_schema() || '_jobs', 'end')");
  }
  ASSERT_TRUE(wait_for(
      [&] {
        listener.get_notifs();
        return wakeups.count >= 2;
      },
      10s));
  EXPECT_EQ(wakeups.count, 2) << "one wake-up for the batch, one for the marker";
}

TEST_F(SqlApi, TheLongestSchemaNameStillReachesItsChannels) {
  // pg_notify refuses a channel over 63 bytes: with a longer schema, every enqueue failed while a
  // leader slept, and so did a step-down's notice on <schema>_leader.
  EXPECT_THROW(baton::detail::validate_schema_name(std::string(57, 's')), baton::ConfigError);
  std::string schema = unique_schema("longest");
  schema.resize(56, 'z');
  {
    auto conn = baton::detail::connect({.url = database_url(), .schema = schema});
    baton::detail::migrate(*conn, schema);
  }
  pqxx::connection listener(database_url());
  struct Seen : pqxx::notification_receiver {
    using pqxx::notification_receiver::notification_receiver;
    void operator()(const std::string& payload, int) override { payloads.push_back(payload); }
    std::vector<std::string> payloads;
  } jobs(listener, baton::detail::jobs_channel(schema)),
      leader(listener, baton::detail::leader_channel(schema));
  // As a sleeping leader does: hold the wake key of every queue, so enqueue notifies.
  pqxx::nontransaction(listener).exec("SELECT pg_advisory_lock(hashtextextended(" +
                                      listener.quote(schema + "_jobs/*") + ", 0))");
  {
    auto producer = connect(schema);
    pqxx::nontransaction tx(*producer);
    EXPECT_GT(tx.exec("SELECT " + schema + ".enqueue('q', 't')")[0][0].as<long long>(), 0);
    tx.exec_params("SELECT pg_notify($1, 'step-down')", baton::detail::leader_channel(schema));
  }
  EXPECT_TRUE(wait_for(
      [&] {
        listener.get_notifs();
        return jobs.payloads.size() == 1 && leader.payloads.size() == 1;
      },
      10s));
  EXPECT_EQ(jobs.payloads, std::vector<std::string>{"q"});
  pqxx::nontransaction(*db_).exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_F(SqlApi, ProducersNotifyOnlyWhileALeaderSleepsOnTheirQueue) {
  // A NOTIFY makes concurrent producers commit one at a time, so they send one only while a
  // leader holds the wake key of their queue (or of every queue) exclusively, as it does asleep.
  pqxx::connection listener(database_url());
  struct Counter : pqxx::notification_receiver {
    using pqxx::notification_receiver::notification_receiver;
    void operator()(const std::string& payload, int) override { seen.push_back(payload); }
    std::vector<std::string> seen;
  } wakeups(listener, schema_ + "_jobs");
  pqxx::connection leader(database_url());
  pqxx::nontransaction lt(leader);
  Client client(database_url(), schema_);
  auto enqueue_every_way = [&](const std::string& queue) {
    pqxx::nontransaction tx(*db_);
    tx.exec("SELECT enqueue(" + tx.quote(queue) + ", 'noop')");
    tx.exec("SELECT enqueue_many(jsonb_build_array(jsonb_build_object('queue', " + tx.quote(queue) +
            ", 'type', 'noop')))");
    EnqueueOptions options;
    options.queue = queue;
    client.enqueue("noop", {}, options);
    client.enqueue_many("noop", {{{"a", 1}}, {{"a", 2}}}, options);
    client.enqueue_copies("noop", {}, 3, options);
    tx.exec("SELECT pg_notify(current_schema() || '_jobs', 'end')");
  };
  auto heard = [&] {
    EXPECT_TRUE(wait_for(
        [&] {
          listener.get_notifs();
          return !wakeups.seen.empty() && wakeups.seen.back() == "end";
        },
        10s));
    auto out = wakeups.seen;
    wakeups.seen.clear();
    return out;
  };
  auto key = [&](const std::string& queue) {
    return "hashtextextended(" + lt.quote(schema_ + "_jobs/" + queue) + ", 0)";
  };
  enqueue_every_way("mail");
  EXPECT_EQ(heard(), std::vector<std::string>{"end"}) << "no leader sleeps: nobody to wake";

  lt.exec("SELECT pg_advisory_lock(" + key("mail") + ")");
  enqueue_every_way("mail");
  EXPECT_EQ(heard(), (std::vector<std::string>{"mail", "mail", "mail", "mail", "mail", "end"}))
      << "one NOTIFY per enqueue";
  enqueue_every_way("default");
  EXPECT_EQ(heard(), std::vector<std::string>{"end"}) << "the leader sleeps on mail only";

  lt.exec("SELECT pg_advisory_unlock_all()");
  lt.exec("SELECT pg_advisory_lock(" + key("*") + ")");
  enqueue_every_way("default");
  EXPECT_EQ(heard(), (std::vector<std::string>{"default", "default", "default", "default",
                                               "default", "end"}));
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 4 * 8);
}

TEST_F(SqlApi, TheClientsTypedColumnsFollowTheRulesOfEnqueueMany) {
  // The Client sends typed columns to enqueue_columns; every other producer sends JSON to
  // enqueue_many. A bad job gets the same answer both ways, and a good one the same row.
  Client client(database_url(), schema_);
  struct Case {
    std::string what;
    std::string type = "noop";
    EnqueueOptions options{};
    nlohmann::json payload = nlohmann::json::object();
  };
  std::vector<Case> cases(9);
  cases[0] = {.what = "bad type", .type = "no spaces"};
  cases[1] = {.what = "bad queue"};
  cases[1].options.queue = "-dash";
  cases[2] = {.what = "priority"};
  cases[2].options.priority = 40000;
  cases[3] = {.what = "max_attempts"};
  cases[3].options.max_attempts = 0;
  cases[4] = {.what = "delay"};
  cases[4].options.delay = std::chrono::milliseconds(-1);
  cases[5] = {.what = "timeout"};
  cases[5].options.timeout = std::chrono::milliseconds(-5);
  cases[6] = {.what = "partition key"};
  cases[6].options.partition_key = std::string(300, 'k');
  cases[7] = {.what = "payload", .payload = {{"big", std::string(2000, 'x')}}};
  cases[8] = {.what = "idempotency key"};
  cases[8].options.idempotency_key = std::string(300, 'i');
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("UPDATE settings SET value = '1000' WHERE key = 'max_payload_bytes'");
  }
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const baton::EnqueueError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const auto typed = message([&] { client.enqueue_batch({{c.type, c.payload, c.options}}); });
    nlohmann::json job = {{"queue", c.options.queue},
                          {"type", c.type},
                          {"payload", c.payload},
                          {"priority", c.options.priority},
                          {"max_attempts", c.options.max_attempts},
                          {"delay_ms", c.options.delay.count()},
                          {"timeout_ms", c.options.timeout.count()}};
    if (!c.options.partition_key.empty()) job["partition_key"] = c.options.partition_key;
    if (!c.options.idempotency_key.empty()) job["idempotency_key"] = c.options.idempotency_key;
    const auto json = message([&] { client.enqueue_objects(nlohmann::json::array({job})); });
    EXPECT_NE(typed, "accepted");
    EXPECT_EQ(typed, json);
    // Behind a good job, in a batch (a single job goes to enqueue; a batch to enqueue_columns,
    // whose first pass must see every kind of problem).
    const auto second = message([&] {
      client.enqueue_batch({{"noop", {}, EnqueueOptions{}}, {c.type, c.payload, c.options}});
    });
    EXPECT_EQ(second, json);
  }
  {
    // Payloads each within the limit are taken however much they weigh together.
    const nlohmann::json near = {{"s", std::string(900, 'x')}};
    EXPECT_EQ(client.enqueue_many("noop", {near, near, near}).size(), 3U);
    pqxx::nontransaction(*db_).exec("DELETE FROM jobs");
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0) << "a refused batch leaves nothing behind";
  // In a batch, the first job with a problem is the one reported, both ways.
  {
    EnqueueOptions high;
    high.priority = 40000;
    const auto typed = message([&] {
      client.enqueue_batch({{"noop", {}, high}, {"bad type", {}, EnqueueOptions{}}});
    });
    const auto json = message([&] {
      client.enqueue_objects(
          nlohmann::json::array({{{"type", "noop"}, {"priority", 40000}}, {{"type", "bad type"}}}));
    });
    EXPECT_NE(typed.find("priority 40000"), std::string::npos) << typed;
    EXPECT_EQ(typed, json);
  }

  // Mismatched columns are refused, not truncated.
  {
    pqxx::nontransaction tx(*db_);
    try {
      tx.exec(
          "SELECT enqueue_columns('{default,default}', '{noop}', '[{}]', '{0}', '{0}', "
          "'{10}', '{NULL}', '{NULL}', '{NULL}', '{0}')");
      ADD_FAILURE() << "mismatched columns were accepted";
    } catch (const pqxx::sql_error& e) {
      EXPECT_EQ(e.sqlstate(), "BT003");
    }
  }
  // A good batch: the same rows both ways, in order.
  EnqueueOptions options;
  options.queue = "mail";
  options.priority = -3;
  options.max_attempts = 4;
  options.partition_key = "p \"quoted\" \\ {x}";
  options.idempotency_key = "k,1";
  options.timeout = std::chrono::milliseconds(1500);
  const auto ids = client.enqueue_batch({{"noop", {{"n", 1}}, options}, {"other", {}, {}}});
  ASSERT_EQ(ids.size(), 2U);
  EXPECT_LT(ids[0], ids[1]);
  pqxx::nontransaction tx(*db_);
  const auto row = tx.exec_params1(
      "SELECT queue, type, payload::text, priority, max_attempts, partition_key, "
      "idempotency_key, timeout_ms FROM jobs WHERE id = $1",
      ids[0]);
  EXPECT_EQ(row[0].as<std::string>(), "mail");
  EXPECT_EQ(row[1].as<std::string>(), "noop");
  EXPECT_EQ(row[2].as<std::string>(), R"({"n": 1})");
  EXPECT_EQ(row[3].as<int>(), -3);
  EXPECT_EQ(row[4].as<int>(), 4);
  EXPECT_EQ(row[5].as<std::string>(), options.partition_key);
  EXPECT_EQ(row[6].as<std::string>(), "k,1");
  EXPECT_EQ(row[7].as<int>(), 1500);
  EXPECT_EQ(client.enqueue_batch({{"noop", {{"n", 2}}, options}}), std::vector{ids[0]})
      << "a live idempotency key answers with its job";
}

TEST_F(SqlApi, ATriggerEnqueuesInTheSameTransaction) {
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE TABLE orders (id bigint PRIMARY KEY, email text)");
    tx.exec(
        "CREATE FUNCTION order_placed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM enqueue('mail', 'send_email', jsonb_build_object('to', NEW.email, "
        "'order', NEW.id), idempotency_key => 'order-' || NEW.id); RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER order_placed AFTER INSERT ON orders "
        "FOR EACH ROW EXECUTE FUNCTION order_placed()");
  }
  {
    pqxx::work tx(*db_);
    tx.exec("INSERT INTO orders VALUES (1, 'ada@example.com')");
    tx.abort();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0) << "the rolled-back order left a job";
  {
    pqxx::work tx(*db_);
    tx.exec("INSERT INTO orders VALUES (2, 'bob@example.com')");
    tx.commit();
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE payload->>'to' = 'bob@example.com'"), 1);
}

TEST_F(SqlApi, ARoleWithOnlyExecuteCanEnqueueButNotTouchTables) {
  pqxx::connection producer(role_url(
      "producer", {std::string("GRANT EXECUTE ON FUNCTION ") + kNineArguments + " TO @role"}));
  auto as_producer = [&](const std::string& sql) -> std::string {
    try {
      pqxx::nontransaction tx(producer);
      return tx.exec(sql)[0][0].c_str();
    } catch (const pqxx::sql_error& e) {
      return std::string("error: ") + e.what();
    }
  };
  const auto id =
      as_producer("SELECT " + schema_ + ".enqueue('q', 'noop', '{\"via\": \"execute only\"}')");
  EXPECT_GT(std::atoll(id.c_str()), 0) << id;
  EXPECT_NE(as_producer("SELECT count(*) FROM " + schema_ + ".jobs").find("permission denied"),
            std::string::npos)
      << "the producer role could read the jobs table";
  EXPECT_NE(as_producer("SELECT " + schema_ + ".enqueue_many('[]')").find("permission denied"),
            std::string::npos)
      << "EXECUTE was granted on enqueue only";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE payload->>'via' = 'execute only'"), 1);
}

// The three-argument enqueue is executable by every role, but only calls the nine-argument one:
// a role without EXECUTE on that is refused, whichever form it calls, and enqueues nothing.
TEST_F(SqlApi, ARoleWithoutExecuteIsRefusedThroughTheThreeArgumentEnqueueToo) {
  const std::string role = schema_.substr(0, 40) + "_stranger";
  pqxx::connection stranger(role_url("stranger", {}));
  const auto as_stranger = [&](const std::string& sql) -> std::string {
    try {
      pqxx::nontransaction tx(stranger);
      return tx.exec(sql)[0][0].c_str();
    } catch (const pqxx::sql_error& e) {
      return std::string("error: ") + e.what();
    }
  };
  for (const std::string call : {"enqueue('q', 'noop', '{\"via\": \"stranger\"}')",
                                 "enqueue('q', 'noop', '{\"via\": \"stranger\"}'::text)",
                                 "enqueue('q', 'noop', '{\"via\": \"stranger\"}'::jsonb)"}) {
    const auto out = as_stranger("SELECT " + schema_ + "." + call);
    EXPECT_NE(out.find("permission denied for function enqueue"), std::string::npos)
        << call << ": " << out;
  }
  // Nor by calling after a role that may, in the same transaction (PL/pgSQL checks the inner
  // call's EXECUTE once a transaction): after SET ROLE (without the function's own check, the
  // stranger enqueued), or after a SECURITY DEFINER function of the application's that enqueues
  // (refused even without it, kept as a guard).
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "CREATE FUNCTION app_enqueue() RETURNS bigint LANGUAGE sql SECURITY DEFINER "
        "SET search_path = " +
        schema_ + " AS $$ SELECT enqueue('q', 'noop', '{\"via\": \"app\"}') $$");
    tx.exec("GRANT EXECUTE ON FUNCTION app_enqueue() TO " + role);
  }
  // The stranger's own call, in a transaction where another role has enqueued.
  const auto refused_after = [&](pqxx::work& tx, const char* after) {
    try {
      tx.exec("SELECT " + schema_ + ".enqueue('q', 'noop', '{\"via\": \"stranger\"}')");
      ADD_FAILURE() << "the stranger enqueued after " << after;
    } catch (const pqxx::sql_error& e) {
      EXPECT_NE(std::string(e.what()).find("permission denied for function enqueue"),
                std::string::npos)
          << after << ": " << e.what();
    }
  };
  {
    pqxx::work tx(stranger);
    EXPECT_GT(tx.exec("SELECT " + schema_ + ".app_enqueue()")[0][0].as<std::int64_t>(), 0);
    refused_after(tx, "the application's function");
  }
  {
    pqxx::work tx(*db_);
    EXPECT_GT(
        tx.exec("SELECT enqueue('q', 'noop', '{\"via\": \"owner\"}')")[0][0].as<std::int64_t>(), 0);
    tx.exec("SET LOCAL ROLE " + role);
    refused_after(tx, "the owner, in one transaction");
  }
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
}

// The Client asks whether its role may call the nine-argument enqueue, the one its single-job
// statement calls, not every enqueue: with the three-argument one's PUBLIC grant revoked (an
// operator's own hardening), a role granted the docs' producer block still sends a single job
// to enqueue (before, the Client took it for a role that may not, and sent it to
// enqueue_columns). Seen in the function counters of the Client's session.
TEST_F(SqlApi, AClientSendsSingleJobsToEnqueueWithoutTheThreeArgumentOnesPublicGrant) {
  const std::string columns =
      "enqueue_columns(text[], text[], jsonb, int[], bigint[], int[], timestamptz[], text[], "
      "text[], int[])";
  const auto url = role_url("single", {std::string("GRANT EXECUTE ON FUNCTION ") + kNineArguments +
                                           ", " + columns + " TO @role",
                                       "ALTER ROLE @role SET track_functions = 'all'"});
  pqxx::nontransaction(*db_).exec(
      "REVOKE EXECUTE ON FUNCTION enqueue(text, text, text) FROM PUBLIC");
  const auto calls = [&](const std::string& signature) {
    return count("SELECT coalesce(pg_stat_get_function_calls('" + schema_ + "." + signature +
                 "'::regprocedure), 0)");
  };
  const std::string nine = kNineArguments;
  {
    Client client(url, schema_);
    const auto id = client.enqueue("noop", nlohmann::json{{"via", "single"}});
    EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE id = " + std::to_string(id) +
                    " AND payload->>'via' = 'single'"),
              1);
  }
  // The counters arrive when the Client's session ends (an idle session sends them only after
  // 10 s).
  EXPECT_TRUE(wait_for([&] { return calls(nine) == 1; }, std::chrono::seconds(10)))
      << "the single job did not go to the nine-argument enqueue";
  EXPECT_EQ(calls(columns), 0) << "the single job went to enqueue_columns";
}

// A call of three arguments whose payload is a literal, an untyped parameter or text takes the
// enqueue without defaults (migration 0021); a jsonb payload, a fourth argument or a named
// option takes the nine-argument one. Both make the same job, with the same checks.
TEST_F(SqlApi, AThreeArgumentCallMakesTheSameJobWithoutReadingTheDefaults) {
  const auto plan = [&](const std::string& call) {
    pqxx::nontransaction tx(*db_);
    std::string text;
    for (const auto& row : tx.exec("EXPLAIN (VERBOSE, COSTS OFF) SELECT " + call)) {
      text += row[0].c_str();
    }
    return text;
  };
  EXPECT_NE(plan("enqueue('q', 'noop', '{\"a\": 1}')")
                .find("enqueue('q'::text, 'noop'::text, '{\"a\": 1}'::text)"),
            std::string::npos)
      << plan("enqueue('q', 'noop', '{\"a\": 1}')");
  // The nine-argument enqueue shows its defaults filled in.
  for (const std::string call :
       {"enqueue('q', 'noop', '{\"a\": 1}'::jsonb)", "enqueue('q', 'noop', '{\"a\": 1}', 3)",
        "enqueue('q', 'noop', '{\"a\": 1}', timeout_ms => 5)", "enqueue('q', 'noop')"}) {
    EXPECT_NE(plan(call).find("::jsonb, "), std::string::npos) << plan(call);
  }
  const auto job = [&](std::int64_t id) {
    pqxx::nontransaction tx(*db_);
    const auto r = tx.exec_params(
        "SELECT queue, type, payload::text, priority, max_attempts, timeout_ms IS NULL, "
        "partition_key IS NULL, idempotency_key IS NULL, shard, state, "
        "run_at <= now() AND run_at > now() - interval '1 minute' FROM jobs WHERE id = $1",
        id);
    EXPECT_EQ(r.size(), 1U) << "no job " << id;
    std::string out;
    for (const auto& f : r[0])
      out += std::string(f.is_null() ? "NULL" : f.c_str()) + "|";
    return out;
  };
  const auto literal = count("SELECT enqueue('q', 'noop', '{\"a\": 1}')");
  const auto typed = count("SELECT enqueue('q', 'noop', '{\"a\": 1}'::jsonb)");
  const auto as_text = count("SELECT enqueue('q', 'noop', '{\"a\": 1}'::varchar)");
  EXPECT_EQ(job(literal), job(typed));
  EXPECT_EQ(job(as_text), job(typed));
  // A NULL payload is the empty object, as it was.
  EXPECT_NE(job(count("SELECT enqueue('q', 'noop', NULL)")).find("|{}|"), std::string::npos);
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("PREPARE untyped AS SELECT enqueue($1, $2, $3)");
  }
  EXPECT_EQ(job(count("EXECUTE untyped('q', 'noop', '{\"a\": 1}')")), job(typed));
  // The checks are the nine-argument enqueue's; a text that is not JSON is refused as before.
  const auto refused = [&](const std::string& call, const std::string& state) {
    try {
      pqxx::nontransaction tx(*db_);
      tx.exec("SELECT " + call);
      ADD_FAILURE() << call << " was accepted";
    } catch (const pqxx::sql_error& e) {
      EXPECT_EQ(e.sqlstate(), state) << call << ": " << e.what();
    }
  };
  const auto before = count("SELECT count(*) FROM jobs");
  refused("enqueue('q', 'noop', 'not json')", "22P02");
  refused("enqueue('bad queue', 'noop', '{}')", "BT001");
  refused("enqueue('q', 'noop', '\"' || repeat('x', 2000000) || '\"')", "BT002");
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), before) << "a refused call left a job";
}

TEST_F(SqlApi, ANodeScriptWithThePgPackageEnqueuesAndSeesTheJobFinish) {
  std::string out;
  if (run_command("command -v node && command -v npm", &out) != 0) {
    GTEST_SKIP() << "node and npm are not installed on this machine";
  }
  RunningNode n(test_config(schema_, "solo"),
                [](Node& node) { node.handle("from_node", [](JobContext&) {}); });
  const std::string dir = temp_dir("node_pg");
  std::ofstream(dir + "/enqueue.js") << R"js(
const { Client } = require('pg');
(async () => {
  const [url, schema] = process.argv.slice(2);
  const db = new Client({ connectionString: url });
  await db.connect();
  const { rows } = await db.query(
    `SELECT ${schema}.enqueue($1, $2, $3::jsonb, priority => $4) AS id`,
    ['default', 'from_node', JSON.stringify({ lang: 'javascript' }), 1]);
  const id = rows[0].id;
  for (let i = 0; i < 200; i++) {
    const done = await db.query(`SELECT 1 FROM ${schema}.job_history WHERE id = $1`, [id]);
    if (done.rowCount === 1) { console.log(`job ${id} finished`); await db.end(); return; }
    await new Promise((r) => setTimeout(r, 50));
  }
  console.error(`job ${id} did not finish`);
  process.exit(1);
})().catch((e) => { console.error(e.message); process.exit(1); });
)js";
  ASSERT_EQ(run_command("cd " + dir + " && npm install --silent --no-audit --no-fund pg@8", &out),
            0)
      << out;
  ASSERT_EQ(
      run_command(
          "cd " + dir + " && timeout 60 node enqueue.js '" + database_url() + "' " + schema_, &out),
      0)
      << out;
  EXPECT_NE(out.find("finished"), std::string::npos) << out;
}

TEST_F(SqlApi, ViewsShowQueuesAndRecentFailures) {
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("SELECT enqueue('q', 't')");
    tx.exec("SELECT enqueue('q', 't', run_at => now() + interval '1 hour')");
    tx.exec(
        "INSERT INTO dead_jobs (id, queue, type, payload, priority, attempts, max_attempts, "
        "created_at, reason, last_error) VALUES (999, 'q', 't', '{}', 0, 3, 3, now(), "
        "'exhausted', 'boom')");
  }
  EXPECT_EQ(count("SELECT available FROM queue_stats WHERE queue = 'q'"), 1);
  EXPECT_EQ(count("SELECT scheduled FROM queue_stats WHERE queue = 'q'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM recent_failures WHERE last_error = 'boom' AND "
                  "status = 'dead: exhausted'"),
            1);
}

}  // namespace
