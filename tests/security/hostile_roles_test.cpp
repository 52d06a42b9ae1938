// Attacks by roles that can connect: a producer with the documented grants, and a stranger with
// nothing but CONNECT (and USAGE on the schema, to make every door worth trying). Each test is the
// attacker's move and what must hold afterwards. The schema's owner is the test's superuser: the
// worst case, where running as the owner means running as a superuser.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include "baton/admin.h"
#include "baton/client.h"
#include "baton/detail/job_store.h"
#include "support/roles.h"
#include "support/schema_test.h"

namespace {

using namespace baton::test;

class HostileRoles : public SchemaTest {
 protected:
  void SetUp() override {
    SchemaTest::SetUp();
    producer_ = role_name(schema_, "producer");
    stranger_ = role_name(schema_, "stranger");
    operator_ = role_name(schema_, "operator");
    pqxx::nontransaction tx(*db_);
    for (const auto& r : {producer_, stranger_, operator_})
      tx.exec("CREATE ROLE " + tx.quote_name(r) + " LOGIN");
    tx.exec(documented_block("sql-api.md", "producer", "producer", schema_, producer_));
    tx.exec("GRANT USAGE ON SCHEMA " + schema_ + " TO " + stranger_);
    tx.exec(documented_block("security.md", "operator", "baton_operator", schema_, operator_));
  }
  std::unique_ptr<pqxx::connection> as(const std::string& role) {
    auto conn = std::make_unique<pqxx::connection>(url_as(role));
    pqxx::nontransaction(*conn).exec("SET search_path TO public");
    return conn;
  }
  // Runs `sql` and returns "" or the error's text.
  static std::string attempt(pqxx::connection& conn, const std::string& sql) {
    try {
      pqxx::nontransaction tx(conn);
      tx.exec(sql);
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  std::string q(const std::string& name) { return schema_ + "." + name; }
  // A call of enqueue_columns for one job of the default queue.
  std::string columns_call(const std::string& payload, const std::string& partition_key) {
    return "SELECT * FROM " + q("enqueue_columns") + "('{default}', '{noop}', '[" + payload +
           "]', '{0}', '{0}', '{10}', '{NULL}', '{" + partition_key + "}', '{NULL}', '{0}')";
  }

  std::string producer_, stranger_, operator_;
};

TEST_F(HostileRoles, AProducerWithTheDocumentedGrantsGetsTheLiveJobForItsKey) {
  // The documented producer may not read jobs: the C++ Client's single job goes to enqueue,
  // which answers a live key with its job's id.
  baton::Client client(url_as(producer_), schema_);
  baton::EnqueueOptions o;
  o.idempotency_key = "invoice-7";
  const auto first = client.enqueue("noop", {}, o);
  EXPECT_EQ(client.enqueue("noop", {{"again", true}}, o), first);
  o.delay = std::chrono::minutes(5);
  EXPECT_EQ(client.enqueue("noop", {}, o), first) << "with a delay";
  EXPECT_EQ(query_value(*db_, "SELECT count(*) FROM jobs"), "1");
}

TEST_F(HostileRoles, AProducersTempJobsTableWithATriggerNeverRunsAsTheOwner) {
  auto attacker = as(producer_);
  const std::string planted = "pwned_" + std::to_string(getpid());
  {
    pqxx::nontransaction tx(*attacker);
    // A temp `jobs` that the unqualified name would find first, with a unique index for the
    // ON CONFLICT clause and a trigger that would run as the function's owner.
    tx.exec(
        "CREATE TEMP TABLE jobs (id bigint GENERATED ALWAYS AS IDENTITY, queue text, "
        "partition int, partition_key text, type text, payload jsonb, priority int, "
        "run_at timestamptz, max_attempts int, idempotency_key text, timeout_ms int)");
    tx.exec(
        "CREATE UNIQUE INDEX ON pg_temp.jobs (queue, idempotency_key) "
        "WHERE idempotency_key IS NOT NULL");
    tx.exec(
        "CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "EXECUTE 'CREATE TABLE public." +
        planted + " (x int)'; RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER evil BEFORE INSERT ON pg_temp.jobs FOR EACH ROW "
        "EXECUTE FUNCTION pg_temp.evil()");
  }
  EXPECT_EQ(attempt(*attacker, "SELECT " + q("enqueue") + "('default', 'noop')"), "");
  EXPECT_EQ(attempt(*attacker, "SELECT * FROM " + q("enqueue_many") + "('[{\"type\": \"noop\"}]')"),
            "");
  EXPECT_EQ(attempt(*attacker, columns_call("{}", "NULL")), "");
  EXPECT_EQ(count("SELECT count(*) FROM pg_tables WHERE tablename = '" + planted + "'"), 0)
      << "the producer's trigger ran as the schema's owner";
  EXPECT_EQ(count("SELECT count(*) FROM " + q("jobs")), 3) << "the jobs went to the temp table";
}

TEST_F(HostileRoles, AProducersTempSettingsNeverLiftThePayloadLimit) {
  auto attacker = as(producer_);
  {
    pqxx::nontransaction tx(*attacker);
    tx.exec("CREATE TEMP TABLE settings (key text PRIMARY KEY, value text)");
    tx.exec("INSERT INTO pg_temp.settings VALUES ('max_payload_bytes', '100000000')");
  }
  const auto error = attempt(*attacker, "SELECT " + q("enqueue") +
                                            "('default', 'noop', jsonb_build_object('blob', "
                                            "repeat('x', 2000000)))");
  EXPECT_NE(error.find("the limit is 1048576 bytes"), std::string::npos) << error;
  const auto columns_error = attempt(
      *attacker, columns_call("{\"blob\": \"" + std::string(2'000'000, 'x') + "\"}", "NULL"));
  EXPECT_NE(columns_error.find("the limit is 1048576 bytes"), std::string::npos)
      << columns_error.substr(0, 300);
  EXPECT_EQ(count("SELECT count(*) FROM " + q("jobs")), 0);
}

TEST_F(HostileRoles, AProducersTempQueueStateNeverPartitionsAQueue) {
  auto attacker = as(producer_);
  {
    pqxx::nontransaction tx(*attacker);
    tx.exec(
        "CREATE TEMP TABLE queue_state (queue text PRIMARY KEY, paused boolean, "
        "partitions integer)");
    tx.exec("INSERT INTO pg_temp.queue_state VALUES ('default', false, 7)");
  }
  EXPECT_EQ(
      attempt(*attacker, "SELECT " + q("enqueue") + "('default', 'noop', partition_key => 'k')"),
      "");
  EXPECT_EQ(attempt(*attacker, columns_call("{}", "k")), "");
  EXPECT_EQ(count("SELECT count(*) FROM " + q("jobs") + " WHERE partition IS NULL"), 2)
      << "a producer's temp table made an unordered queue ordered";
}

TEST_F(HostileRoles, AProducersOwnCollationNeverLetsABadNamePass) {
  // A text argument brings its collation into the function. Under a nondeterministic collation
  // of the producer's own (in pg_temp), characters it ignores would compare equal to nothing,
  // and a name check written as ltrim(name, allowed) = '' would pass 'ab\x01'.
  auto attacker = as(producer_);
  const auto made = attempt(*attacker,
                            "CREATE COLLATION pg_temp.loose (provider = icu, "
                            "locale = 'und-u-ks-level1-ka-shifted', deterministic = false)");
  if (!made.empty()) GTEST_SKIP() << "no ICU collation here: " << made;
  const std::string loose = " COLLATE pg_temp.loose";
  for (const std::string& call :
       {"SELECT " + q("enqueue") + "(('ab' || chr(1))" + loose + ", 'noop')",
        "SELECT " + q("enqueue") + "('default', ('no op')" + loose + ")",
        "SELECT * FROM " + q("enqueue_columns") + "(ARRAY[('ab' || chr(1))" + loose +
            "], '{noop}', '[{}]', '{0}', '{0}', '{10}', '{NULL}', '{NULL}', '{NULL}', '{0}')",
        "SELECT * FROM " + q("enqueue_columns") + "(ARRAY['default'" + loose +
            ", 'default'], ARRAY['noop', 'NOOP' || chr(1)], '[{}, {}]', '{0,0}', '{0,0}', "
            "'{10,10}', '{NULL,NULL}', '{NULL,NULL}', '{NULL,NULL}', '{0,0}')"}) {
    SCOPED_TRACE(call);
    const auto error = attempt(*attacker, call);
    EXPECT_NE(error.find("is not allowed"), std::string::npos) << error;
  }
  EXPECT_EQ(count("SELECT count(*) FROM " + q("jobs")), 0);
}

TEST_F(HostileRoles, EverySecurityDefinerFunctionSearchesOnlyBatonsSchemaThenPgTemp) {
  // The rule, checked on every function that runs as its owner (a new one is covered too).
  const auto rows = pqxx::nontransaction(*db_).exec_params(
      "SELECT p.proname, coalesce((SELECT string_agg(c, ';') FROM unnest(p.proconfig) c "
      "                            WHERE c LIKE 'search\\_path=%'), '') "
      "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
      "WHERE n.nspname = $1 AND p.prosecdef ORDER BY 1",
      schema_);
  ASSERT_GE(rows.size(), 5u) << "enqueue, enqueue_many, cancel, job_status, job_id_by_key";
  for (const auto& r : rows) {
    // enqueue alone runs on its caller's path, naming everything it uses (migration 0019; the
    // next test is the attack on that).
    if (std::string(r[0].c_str()) == "enqueue") {
      EXPECT_EQ(std::string(r[1].c_str()), "");
      continue;
    }
    // Other settings (summarize_history's lock_timeout) may stand beside it.
    EXPECT_EQ(std::string(r[1].c_str()), "search_path=" + schema_ + ", pg_temp")
        << r[0].c_str() << " runs as its owner without a safe search_path";
  }
}

TEST_F(HostileRoles, AProducersOwnSearchPathNeverRunsItsObjectsInEnqueue) {
  // enqueue runs as the owner on the caller's search_path. The producer puts a schema of its own
  // before pg_catalog on that path, with operators, functions and a collation named as the ones
  // enqueue's common job uses, and types named as its types in pg_temp (searched first for
  // types). Each planted function raises, naming the role it ran as.
  const std::string planted = schema_ + "_mine";
  pqxx::nontransaction(*db_).exec("CREATE SCHEMA " + planted + " AUTHORIZATION " + producer_);
  // Counts the producer's calls of PL/pgSQL functions: the common job must not reach
  // enqueue_checked (where baton's own search_path would hide a slip in the common job).
  pqxx::nontransaction(*db_).exec("ALTER ROLE " + producer_ + " SET track_functions = 'pl'");
  auto producer = as(producer_);
  pqxx::nontransaction tx(*producer);
  tx.exec("SET search_path = " + planted + ", pg_catalog");
  tx.exec("CREATE FUNCTION " + planted +
          ".boom() RETURNS boolean LANGUAGE plpgsql AS $f$BEGIN RAISE EXCEPTION 'planted code "
          "ran as %', current_user; END$f$");
  int n = 0;
  for (const auto& [left, op, right, result] :
       {std::tuple{"text", "=", "text", "boolean"}, std::tuple{"text", "||", "text", "text"},
        std::tuple{"text", "~", "text", "boolean"},
        std::tuple{"integer", ">=", "integer", "boolean"},
        std::tuple{"integer", "<=", "integer", "boolean"},
        std::tuple{"integer", "<", "integer", "boolean"},
        std::tuple{"integer", ">", "integer", "boolean"},
        std::tuple{"integer", "=", "integer", "boolean"},
        std::tuple{"bigint", ">", "bigint", "boolean"},
        std::tuple{"integer", ">", "bigint", "boolean"},
        std::tuple{"text", "||", "integer", "text"},
        std::tuple{"double precision", "*", "double precision", "double precision"}}) {
    const std::string f = planted + ".op_" + std::to_string(++n);
    tx.exec(std::string("CREATE FUNCTION ") + f + "(" + left + ", " + right + ") RETURNS " +
            result + " LANGUAGE sql AS $f$SELECT CASE WHEN " + planted +
            ".boom() THEN NULL END::" + result + "$f$");
    tx.exec(std::string("CREATE OPERATOR ") + planted + "." + op + " (LEFTARG = " + left +
            ", RIGHTARG = " + right + ", FUNCTION = " + f + ")");
  }
  for (const auto& [name, args, result] :
       {std::tuple{"octet_length", "text", "integer"}, std::tuple{"now", "", "timestamptz"},
        std::tuple{"random", "", "double precision"},
        std::tuple{"floor", "double precision", "double precision"},
        std::tuple{"hashtextextended", "text, bigint", "bigint"},
        std::tuple{"pg_notify", "text, text", "void"},
        std::tuple{"pg_try_advisory_xact_lock_shared", "bigint", "boolean"}}) {
    tx.exec(std::string("CREATE FUNCTION ") + planted + "." + name + "(" + args + ") RETURNS " +
            result + " LANGUAGE plpgsql AS $f$BEGIN PERFORM " + planted + ".boom(); END$f$");
  }
  // Nondeterministic: a regular expression under it is an error, and a hash differs.
  tx.exec("CREATE COLLATION " + planted +
          ".\"C\" (provider = icu, locale = 'und-u-ks-level2', deterministic = false)");
  for (const char* type :
       {"text", "int8", "int4", "int2", "bool", "float8", "jsonb", "timestamptz"}) {
    tx.exec(std::string("CREATE DOMAIN pg_temp.") + type + " AS pg_catalog." + type + " CHECK (" +
            planted + ".boom())");
  }
  // The attack is live: the producer's own SQL runs the planted code.
  EXPECT_THROW(tx.exec("SELECT 'a'::pg_catalog.text = 'a'::pg_catalog.text"), pqxx::sql_error);
  EXPECT_THROW(tx.exec("SELECT 'a'::text"), pqxx::sql_error);

  // The common job, again and again (from plans cached on this path), on two shards (a wake key
  // of shard 1 ends in "#1": eight jobs miss shard 1 once in 256 runs), with each option that
  // has a value of its own, and once with a leader asleep on the wake keys (the NOTIFY).
  pqxx::nontransaction(*db_).exec("UPDATE " + q("settings") +
                                  " SET value = '2' WHERE key = 'shards'");
  const std::string call = "SELECT " + q("enqueue") + "('default', 'noop', '{\"a\": 1}'";
  // (Its oid read here: on the producer's path, the type names of its signature are the
  // producer's domains.)
  const std::string checked_oid = [&] {
    pqxx::nontransaction own(*db_);
    return std::string(
        own.exec("SELECT " +
                 own.quote(q("enqueue_checked(text, text, jsonb, integer, timestamptz, integer, "
                             "text, text, integer)")) +
                 "::regprocedure::oid")[0][0]
            .c_str());
  }();
  // The three-argument calls take the enqueue without defaults (migration 0021), which runs on
  // this path too; the longer ones take the nine-argument enqueue.
  const std::string three_oid = [&] {
    pqxx::nontransaction own(*db_);
    return std::string(own.exec("SELECT " + own.quote(q("enqueue(text, text, text)")) +
                                "::regprocedure::oid")[0][0]
                           .c_str());
  }();
  const auto calls_of = [&](const std::string& oid) {
    return tx
        .exec("SELECT pg_catalog.pg_stat_get_xact_function_calls(" + oid +
              "::pg_catalog.oid)")[0][0]
        .as<std::int64_t>(0);
  };
  const auto checked_calls = [&] { return calls_of(checked_oid); };
  tx.exec("BEGIN");
  for (int i = 0; i < 8; ++i)
    EXPECT_GT(tx.exec(call + ")")[0][0].as<std::int64_t>(), 0);
  EXPECT_GT(tx.exec(call + ", 5, pg_catalog.now(), 3, timeout_ms => 0)")[0][0].as<std::int64_t>(),
            0);
  EXPECT_EQ(checked_calls(), 0) << "the common job went the other way";
  EXPECT_EQ(calls_of(three_oid), 8) << "the three-argument calls took another function";
  // The counter works: a job with an idempotency key does go there.
  EXPECT_GT(tx.exec(call + ", idempotency_key => 'k')")[0][0].as<std::int64_t>(), 0);
  EXPECT_EQ(checked_calls(), 1);
  tx.exec("COMMIT");
  // A leader asleep on the wake keys of shards 0 and 1 is woken: the keys the common job tries
  // are the leader's, and the NOTIFY goes out.
  pqxx::connection leader(
      url_as(std::string(pqxx::nontransaction(*db_).exec("SELECT current_user")[0][0].c_str())));
  struct Seen : pqxx::notification_receiver {
    using pqxx::notification_receiver::notification_receiver;
    void operator()(const std::string&, int) override { ++count; }
    int count = 0;
  } wakes(leader, schema_ + "_jobs");
  pqxx::nontransaction(leader).exec_params(
      "SELECT pg_advisory_lock(hashtextextended($1, 0)), pg_advisory_lock(hashtextextended($2, 0))",
      schema_ + "_jobs/*", schema_ + "_jobs/*#1");
  EXPECT_GT(tx.exec(call + ")")[0][0].as<std::int64_t>(), 0);
  EXPECT_TRUE(wait_for(
      [&] {
        leader.get_notifs();
        return wakes.count >= 1;
      },
      std::chrono::seconds(10)))
      << "the common job took a wake key no leader holds";
  // And a leader of the queue 'default' alone, asleep on that queue's keys.
  pqxx::nontransaction(leader).exec_params(
      "SELECT pg_advisory_unlock_all(), pg_advisory_lock(hashtextextended($1, 0)), "
      "pg_advisory_lock(hashtextextended($2, 0))",
      schema_ + "_jobs/default", schema_ + "_jobs/default#1");
  EXPECT_GT(tx.exec(call + ")")[0][0].as<std::int64_t>(), 0);
  EXPECT_TRUE(wait_for(
      [&] {
        leader.get_notifs();
        return wakes.count >= 2;
      },
      std::chrono::seconds(10)))
      << "the common job took a queue's wake key no leader holds";
  // A name the checks refuse is still refused, with the checks' message.
  std::string error;
  try {
    tx.exec("SELECT " + q("enqueue") + "('bad name', 'noop')");
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("queue name 'bad name' is not allowed"), std::string::npos) << error;
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 12);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE shard IN (0, 1) AND timeout_ms IS NULL"), 12);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE priority = 5 AND max_attempts = 3"), 1);
}

TEST_F(HostileRoles, NoRoleCallsABatonFunctionWithoutAGrant) {
  auto stranger = as(stranger_);
  for (const char* call :
       {"enqueue('q', 't')", "enqueue('q', 't', '{}')", "enqueue_many('[]')", "validate_jobs('[]')",
        "job_problem('{}', 1, true)", "name_ok('x')", "cancel(1)", "job_status(1)",
        "job_id_by_key('q', 'k')", "job_partition('q', 'k')", "check_name('queue', 'q')"}) {
    const auto error = attempt(*stranger, std::string("SELECT ") + schema_ + "." + call);
    EXPECT_NE(error.find("permission denied"), std::string::npos)
        << "a role without grants called " << call << ": " << error;
  }
  // And every function of the schema, including any a later migration adds, but the
  // three-argument enqueue: it runs as its caller and only calls the nine-argument one (refused
  // above), so it may be executed by every role (migration 0021).
  const auto callable = pqxx::nontransaction(*db_).exec_params(
      "SELECT p.oid::regprocedure::text, p.prosecdef, "
      "       p.oid = to_regprocedure(quote_ident($1) || '.enqueue(text, text, text)') "
      "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
      " WHERE n.nspname = $1 AND has_function_privilege($2, p.oid, 'EXECUTE')",
      schema_, stranger_);
  for (const auto& r : callable) {
    if (r[2].as<bool>() && !r[1].as<bool>()) continue;
    ADD_FAILURE() << "a role without grants may call " << r[0].c_str()
                  << (r[1].as<bool>() ? " (SECURITY DEFINER)" : "");
  }
}

// A dashboard's role granted baton's views and nothing else filters them with a function of its
// own, declared cheap so that PostgreSQL runs it before the view's own conditions, and raises
// what it sees. Without the views' security barrier (migration 0023) it read a dead job older
// than recent_failures' day, with its error, which the view leaves out; and still did with the
// option set on the view as it was, a UNION ALL, which PostgreSQL merges into the reader's query.
// Every text column of every view of the schema is attacked, the tables read by sequential scans
// (so that no choice of index decides whether a filter sees the rows).
TEST_F(HostileRoles, AReaderOfTheViewsSeesNoRowTheyLeaveOutThroughAFunctionOfItsOwn) {
  const auto text_columns = pqxx::nontransaction(*db_).exec_params(
      "SELECT c.relname, a.attname FROM pg_class c "
      "  JOIN pg_namespace n ON n.oid = c.relnamespace "
      "  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
      " WHERE n.nspname = $1 AND c.relkind = 'v' AND a.atttypid = 'text'::regtype "
      " ORDER BY 1, 2",
      schema_);
  ASSERT_GE(text_columns.size(), 5U) << "recent_failures' text columns were not found";
  {
    pqxx::nontransaction tx(*db_);
    for (const auto& r : text_columns)
      tx.exec("GRANT SELECT ON " + q(tx.quote_name(r[0].c_str())) + " TO " + stranger_);
    tx.exec("INSERT INTO jobs (queue, type, last_error) VALUES ('q', 'shown-retrying', 'boom')");
    tx.exec(
        "INSERT INTO dead_jobs (id, queue, type, payload, priority, attempts, max_attempts, "
        "created_at, died_at, reason, last_error) VALUES "
        "(901, 'q', 'shown-dead', '{}', 0, 3, 3, now(), now(), 'exhausted', 'boom'), "
        "(902, 'hidden-q', 'hidden-old', '{}', 0, 3, 3, now(), now() - interval '2 days', "
        "'hidden-reason', 'hidden-secret')");
  }
  auto reader = as(stranger_);
  ASSERT_EQ(attempt(*reader,
                    "CREATE FUNCTION pg_temp.peek(t text) RETURNS bool LANGUAGE plpgsql "
                    "IMMUTABLE COST 0.0000001 AS $$ BEGIN IF t LIKE '%hidden%' THEN "
                    "RAISE EXCEPTION 'saw %', t; END IF; RETURN true; END $$"),
            "");
  // The function does run on what the reader may see.
  EXPECT_NE(attempt(*reader, "SELECT pg_temp.peek('hidden-test')").find("saw hidden-test"),
            std::string::npos);
  ASSERT_EQ(attempt(*reader, "SET enable_indexscan = off; SET enable_bitmapscan = off"), "");
  for (const auto& r : text_columns) {
    const std::string view = r[0].c_str(), column = r[1].c_str();
    EXPECT_EQ(attempt(*reader, "SELECT * FROM " + q(reader->quote_name(view)) +
                                   " WHERE pg_temp.peek(" + reader->quote_name(column) + ")"),
              "")
        << "the reader saw a row " << view << " leaves out, filtering by " << column;
  }
  EXPECT_EQ(query_value(*reader, "SELECT count(*) FROM " + q("recent_failures") +
                                     " WHERE pg_temp.peek(type)"),
            "2");
  // Every view of the schema, including any a later migration adds, is a barrier (a union
  // needs more, above; a view that is a plain query over tables needs no more).
  const auto open = pqxx::nontransaction(*db_).exec_params(
      "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
      " WHERE n.nspname = $1 AND c.relkind = 'v' AND NOT coalesce(("
      "   SELECT o.option_value::bool FROM pg_options_to_table(c.reloptions) o "
      "    WHERE o.option_name = 'security_barrier'), false)",
      schema_);
  for (const auto& r : open)
    ADD_FAILURE() << "view " << r[0].c_str() << " is not a security barrier";
}

TEST_F(HostileRoles, OnlyARoleThatMayWriteControlRequestsAsksForAStepDownAndItIsNamed) {
  auto stranger = as(stranger_);
  EXPECT_NE(attempt(*stranger, "INSERT INTO " + q("control_requests") +
                                   " (kind, target) VALUES ('step_down', '*')")
                .find("permission denied"),
            std::string::npos);
  EXPECT_NE(attempt(*as(producer_), "INSERT INTO " + q("control_requests") +
                                        " (kind, target) VALUES ('step_down', '*')")
                .find("permission denied"),
            std::string::npos);
  // An operator may ask, but cannot say that somebody else did.
  EXPECT_EQ(attempt(*as(operator_), "INSERT INTO " + q("control_requests") +
                                        " (kind, target, requested_by, handled_at) VALUES "
                                        "('step_down', '*', 'the-ceo', now())"),
            "");
  EXPECT_EQ(query_value(*db_, "SELECT requested_by FROM control_requests"), operator_);
  EXPECT_EQ(count("SELECT count(*) FROM control_requests WHERE handled_at IS NULL"), 1)
      << "a request arrived already handled";
}

TEST_F(HostileRoles, NoRoleButTheNodesCanHoldTheGateOfALimitedQueue) {
  // With shards, the claims of a queue with a concurrency limit take turns on its queue_gates
  // row. Whoever could hold that row would stall the queue on every shard: no role here can.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("INSERT INTO queue_gates VALUES ('limited')");
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'limited', 'noop' FROM generate_series(1, 3)");
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('k', 'r', 'me', 1, now() + interval '1 minute')");
  }
  for (const auto& role : {producer_, stranger_, operator_}) {
    auto attacker = as(role);
    for (const char* lock : {"FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE"}) {
      EXPECT_NE(attempt(*attacker, "SELECT 1 FROM " + q("queue_gates") + " " + lock)
                    .find("permission denied"),
                std::string::npos)
          << role << " took " << lock;
    }
    for (const char* mode : {"ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE",
                             "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"}) {
      std::string refused;
      try {
        pqxx::work tx(*attacker);
        tx.exec("LOCK TABLE " + q("queue_gates") + " IN " + mode + " MODE");
      } catch (const std::exception& e) {
        refused = e.what();
      }
      EXPECT_NE(refused.find("permission denied"), std::string::npos)
          << role << " took " << mode << ": " << refused;
    }
  }
  // The key the gate used to be (an advisory lock, which any role may take), held by a stranger,
  // and what a reader may take (an ACCESS SHARE lock), held open: neither stops a limited claim.
  auto squatter = as(stranger_);
  ASSERT_EQ(attempt(*squatter, "SELECT pg_advisory_lock(hashtextextended('" + schema_ +
                                   "' || '_limit/limited', 0))"),
            "");
  auto reader = as(operator_);
  pqxx::work open(*reader);
  open.exec("LOCK TABLE " + q("queue_gates") + " IN ACCESS SHARE MODE");
  const baton::detail::ClaimFilter limited{{"limited"}, {}, {"noop"}, false, 0, 2};
  pqxx::nontransaction(*db_).exec("SET lock_timeout = '2s'");  // a claim that waits fails
  const auto jobs = baton::detail::claim_jobs(*db_, {{"k", "r"}, "me", 1}, 10, limited);
  EXPECT_EQ(jobs.size(), 2u) << "the limit of 2 running jobs, claimed past the reader";
  open.abort();
  // The gate gates: while a node's session holds the row, a limited claim waits for it.
  auto holder = connect(schema_);
  pqxx::work held(*holder);
  held.exec("SELECT 1 FROM queue_gates WHERE queue = 'limited' FOR UPDATE");
  auto claimer = connect(schema_);
  pqxx::nontransaction(*claimer).exec("SET lock_timeout = '300ms'");
  try {
    baton::detail::claim_jobs(*claimer, {{"k", "r"}, "me", 1}, 10, limited);
    ADD_FAILURE() << "a limited claim went past a held gate";
  } catch (const pqxx::sql_error& e) {
    EXPECT_EQ(e.sqlstate(), "55P03") << e.what();
  }
  held.abort();
}

TEST_F(HostileRoles, OperatorsPlantedOnACallersSearchPathNeverRunInBatonsStatements) {
  // The stranger may create objects in a schema on other roles' search_path (as anyone may in
  // public, in a database made before PostgreSQL 15). It plants operators for argument types
  // that pg_catalog matches only through a cast (bigint * interval, float8 * integer,
  // bigint % integer): there, an exact match found on the path wins. The Client and an Admin
  // made from a URL run baton's statements in the caller's session, with the caller's path;
  // the caller here is the superuser.
  const std::string planted = schema_ + "_planted";
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE SCHEMA " + planted + " AUTHORIZATION " + stranger_);
    tx.exec("GRANT USAGE ON SCHEMA " + planted + " TO PUBLIC");
  }
  {
    auto stranger = as(stranger_);
    pqxx::nontransaction tx(*stranger);
    // Each returns what pg_catalog's would, so that a statement that found it runs it.
    int n = 0;
    for (const auto& [left, op, right, result] :
         {std::tuple{"bigint", "*", "interval", "interval"},
          std::tuple{"double precision", "*", "integer", "double precision"},
          std::tuple{"bigint", "%", "integer", "bigint"}}) {
      const std::string f = planted + ".planted_" + std::to_string(++n);
      tx.exec(std::string("CREATE FUNCTION ") + f + "(" + left + ", " + right + ") RETURNS " +
              result +
              " LANGUAGE plpgsql AS $f$BEGIN RAISE EXCEPTION 'the planted operator ran as %', "
              "current_user; END$f$");
      tx.exec(std::string("CREATE OPERATOR ") + planted + "." + op + " (LEFTARG = " + left +
              ", RIGHTARG = " + right + ", FUNCTION = " + f + ")");
    }
  }
  const std::string victim_url =
      url_as(std::string(pqxx::nontransaction(*db_).exec("SELECT current_user")[0][0].c_str())) +
      " options='-csearch_path=" + planted + "'";
  {
    // The attack is live: in the victim's session, plain SQL runs the planted operator.
    pqxx::connection victim(victim_url);
    pqxx::nontransaction tx(victim);
    EXPECT_THROW(tx.exec("SELECT 5::bigint * interval '1 millisecond'"), pqxx::sql_error);
    // baton's inlined SQL functions, called from the victim's own SQL, do not run them.
    for (const char* call : {"shard_of(NULL, 4)", "shard_of('key', 4)", "partition_of('key', 3)"}) {
      EXPECT_NO_THROW(tx.exec("SELECT " + q(call))) << call;
    }
    // With the same results as pg_catalog's operators on the same values.
    EXPECT_EQ(tx.exec("SELECT " + q("shard_of('key', 4)") +
                      " = ((pg_catalog.hashtextextended("
                      "'key', 0) OPERATOR(pg_catalog.%) 4) OPERATOR(pg_catalog.+) 4) "
                      "OPERATOR(pg_catalog.%) 4")[0][0]
                  .as<bool>(),
              true);
  }
  // Two shards: a job without a key gets one through shard_of's float8 * integer.
  pqxx::nontransaction(*db_).exec("UPDATE " + q("settings") +
                                  " SET value = '2' WHERE key = 'shards'");
  baton::Client client(victim_url, schema_);
  EXPECT_GT(client.enqueue("t", {{"n", 1}}, {.delay = std::chrono::hours(1)}), 0);
  EXPECT_EQ(client.enqueue_copies("t", {{"n", 2}}, 3, {.delay = std::chrono::seconds(5)}).size(),
            3u);
  baton::Admin admin(victim_url, schema_, "ops");
  EXPECT_EQ(admin.purge_dead(std::chrono::hours(1)), 0);
  pqxx::nontransaction(*db_).exec(
      "INSERT INTO " + q("dead_jobs") +
      " (id, queue, type, payload, priority, attempts, max_attempts, reason, created_at, died_at) "
      "SELECT 900001, 'default', 't', '{}', 0, 1, 1, 'failed', now(), now()");
  EXPECT_TRUE(admin.retry_dead(900001));
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 5);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE shard NOT IN (0, 1)"), 0);
  pqxx::nontransaction(*db_).exec("DROP SCHEMA " + planted + " CASCADE");
}

}  // namespace
