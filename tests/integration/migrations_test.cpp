// Migrations against a real PostgreSQL: once under concurrency, idempotent, newer refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/roles.h"
#include "support/support.h"

namespace {

using namespace baton::test;
namespace detail = baton::detail;

// Whether the session named `app` has waited on a lock of kind `event` (relation, advisory) for
// longer than `past`.
bool waiting_for(pqxx::connection& probe, const std::string& app, const std::string& event,
                 std::chrono::seconds past) {
  pqxx::nontransaction tx(probe);
  return tx.exec_params(
               "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE application_name = $1 "
               "AND wait_event = $2 AND now() - query_start > $3::bigint * interval "
               "'1 second'",
               app, event, static_cast<std::int64_t>(past.count()))
             .size() == 1;
}

TEST(Migrations, ManyProcessesStartingAtOnceMigrateExactlyOnce) {
  const std::string schema = unique_schema("migrate_once");
  constexpr int kStarters = 8;
  std::vector<int> applied(kStarters, -1);
  std::vector<std::string> errors(kStarters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStarters; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto conn = detail::connect({.url = database_url(), .schema = schema});
        applied[i] = detail::migrate(*conn, schema);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  int total = 0;
  for (int i = 0; i < kStarters; ++i) {
    EXPECT_EQ(errors[i], "") << "starter " << i;
    total += applied[i];
  }
  EXPECT_EQ(total, detail::latest_schema_version()) << "each migration applied exactly once";
  auto conn = connect(schema);
  EXPECT_EQ(query_int(*conn, "SELECT count(*) FROM schema_migrations"),
            detail::latest_schema_version());
  auto again = detail::connect({.url = database_url(), .schema = schema});
  EXPECT_EQ(detail::migrate(*again, schema), 0) << "re-running is a no-op";
  EXPECT_NO_THROW(detail::require_current_schema(*again, schema));
}

TEST(Migrations, RefusesASchemaNewerThanTheBinary) {
  const std::string schema = unique_schema("migrate_newer");
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  detail::migrate(*conn, schema);
  {
    pqxx::work tx(*conn);
    tx.exec_params("INSERT INTO schema_migrations (version, name) VALUES ($1, 'future')",
                   detail::latest_schema_version() + 1);
    tx.commit();
  }
  try {
    detail::migrate(*conn, schema);
    ADD_FAILURE() << "migrated a newer schema";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("newer than this binary"), std::string::npos) << e.what();
  }
  try {
    detail::require_current_schema(*conn, schema);
    ADD_FAILURE() << "accepted a newer schema";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("upgrade baton"), std::string::npos) << e.what();
  }
}

TEST(Migrations, AnUpgradeLetsTheRolesThatPruneHistoryCallItsNewFunctions) {
  // Migration 0018 moved history pruning into two functions that run with the owner's rights. A
  // cluster whose nodes run as a role of their own had DELETE on job_history from an older
  // release's grants: after the upgrade that role must be able to call the functions, or history
  // stops being pruned. A role that may read and add history but not delete it gets nothing,
  // nor does PUBLIC.
  constexpr int kBefore = 17;  // the version before 0018
  const std::string schema = unique_schema("migrate_prune_grants");
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  ASSERT_EQ(detail::migrate(*conn, schema, kBefore), kBefore);
  const auto node = role_name(schema, "node");
  const auto reader = role_name(schema, "reader");
  {
    pqxx::nontransaction tx(*conn);
    for (const auto& r : {node, reader})
      tx.exec("CREATE ROLE " + tx.quote_name(r) + " LOGIN");
    const auto history = tx.quote_name(schema) + ".job_history";
    tx.exec("GRANT USAGE ON SCHEMA " + tx.quote_name(schema) + " TO " + tx.quote_name(node) + ", " +
            tx.quote_name(reader));
    tx.exec("GRANT SELECT, INSERT, DELETE ON " + history + " TO " + tx.quote_name(node));
    tx.exec("GRANT SELECT, INSERT ON " + history + " TO " + tx.quote_name(reader));
  }
  EXPECT_EQ(detail::migrate(*conn, schema), detail::latest_schema_version() - kBefore);
  for (const char* fn : {"prune_history(bigint, integer)", "summarize_history(bigint, integer)"}) {
    const auto may = [&](const std::string& role) {
      pqxx::nontransaction tx(*conn);
      return tx
          .exec_params("SELECT has_function_privilege($1, $2, 'EXECUTE')", role,
                       tx.quote_name(schema) + "." + fn)[0][0]
          .as<bool>();
    };
    EXPECT_TRUE(may(node)) << fn;
    EXPECT_FALSE(may(reader)) << fn;
    pqxx::nontransaction tx(*conn);
    EXPECT_EQ(tx.exec_params("SELECT count(*) FROM pg_catalog.pg_proc p, "
                             "pg_catalog.aclexplode(p.proacl) a WHERE p.oid = $1::regprocedure "
                             "AND a.grantee = 0",
                             tx.quote_name(schema) + "." + fn)[0][0]
                  .as<int>(),
              0)
        << fn << " is granted to PUBLIC";
  }
  // The node's role prunes; the reader's is refused.
  pqxx::connection as_node(url_as(node));
  EXPECT_NO_THROW(pqxx::nontransaction(as_node).exec("SELECT " + as_node.quote_name(schema) +
                                                     ".prune_history(3600000, 10)"));
  pqxx::connection as_reader(url_as(reader));
  EXPECT_THROW(pqxx::nontransaction(as_reader).exec("SELECT " + as_reader.quote_name(schema) +
                                                    ".prune_history(3600000, 10)"),
               pqxx::insufficient_privilege);
}

TEST(Migrations, TheJobsRulesMoveToDomainsKeepingRowsViewsAndGrants) {
  // Migration 0022 moves the jobs table's three CHECK constraints into domains. An upgrade keeps
  // every row where it was (the table is not rewritten), the views over jobs with their grants,
  // and the claim index usable; afterwards the rules refuse the same values as before, from any
  // role that may write jobs, and such a role cannot drop them.
  constexpr int kBefore = 21;
  const std::string schema = unique_schema("migrate_domains");
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  ASSERT_EQ(detail::migrate(*conn, schema, kBefore), kBefore);
  const auto producer = role_name(schema, "producer");
  const auto reader = role_name(schema, "reader");
  std::int64_t table_file = 0;
  {
    pqxx::nontransaction tx(*conn);
    for (const auto& r : {producer, reader})
      tx.exec("CREATE ROLE " + tx.quote_name(r) + " LOGIN");
    const auto s = tx.quote_name(schema);
    tx.exec("GRANT USAGE ON SCHEMA " + s + " TO " + tx.quote_name(producer) + ", " +
            tx.quote_name(reader));
    tx.exec("GRANT SELECT, INSERT, UPDATE ON " + s + ".jobs TO " + tx.quote_name(producer));
    tx.exec("GRANT SELECT ON " + s + ".recent_failures TO " + tx.quote_name(reader));
    // A column grant, a comment and a view of the deployment's own over one of baton's views.
    tx.exec("GRANT SELECT (queue, available, running) ON " + s + ".queue_stats TO " +
            tx.quote_name(reader));
    tx.exec("COMMENT ON VIEW " + s + ".queue_stats IS 'per queue'");
    tx.exec("CREATE VIEW " + s + ".own_depth AS SELECT queue, available FROM " + s +
            ".queue_stats");
    tx.exec("GRANT SELECT ON " + s + ".own_depth TO " + tx.quote_name(reader));
    tx.exec(
        "INSERT INTO jobs (queue, type, max_attempts, timeout_ms) "
        "SELECT 'q', 'noop', 1 + g % 1000, nullif(g % 3, 0) * 100 "
        "FROM generate_series(1, 3000) g");
    tx.exec(
        "UPDATE jobs SET state = 'running', claim_group = 'g', claimed_epoch = 1 "
        "WHERE id % 10 = 0");
    tx.exec("UPDATE jobs SET last_error = 'boom' WHERE id % 100 = 1");
    // Only the migration may gather the columns' statistics checked below.
    tx.exec("ALTER TABLE jobs SET (autovacuum_enabled = false)");
    table_file =
        tx.exec("SELECT relfilenode FROM pg_catalog.pg_class WHERE oid = 'jobs'::regclass")[0][0]
            .as<std::int64_t>();
  }
  EXPECT_EQ(detail::migrate(*conn, schema), detail::latest_schema_version() - kBefore);
  {
    pqxx::nontransaction tx(*conn);
    EXPECT_EQ(
        tx.exec("SELECT relfilenode FROM pg_catalog.pg_class WHERE oid = 'jobs'::regclass")[0][0]
            .as<std::int64_t>(),
        table_file)
        << "the jobs table was rewritten";
    EXPECT_EQ(tx.exec("SELECT count(*) FROM pg_catalog.pg_constraint "
                      "WHERE conrelid = 'jobs'::regclass AND contype = 'c'")[0][0]
                  .as<int>(),
              0);
    const auto stats = tx.exec("SELECT available, running FROM queue_stats WHERE queue = 'q'");
    ASSERT_EQ(stats.size(), 1U);
    EXPECT_EQ(stats[0][0].as<int>(), 2700);
    EXPECT_EQ(stats[0][1].as<int>(), 300);
    tx.exec("SET enable_seqscan = off");
    const auto plan = tx.exec(
        "EXPLAIN SELECT id FROM jobs WHERE state = 'available' AND shard = 0 "
        "ORDER BY shard, priority, run_at, id LIMIT 10");
    std::string text;
    for (const auto& r : plan)
      text += std::string(r[0].c_str()) + "\n";
    EXPECT_NE(text.find("jobs_claim_idx"), std::string::npos) << text;
  }
  // The views kept their grants and their column types.
  {
    pqxx::connection as_reader(url_as(reader));
    pqxx::nontransaction tx(as_reader);
    const auto s = tx.quote_name(schema);
    EXPECT_EQ(tx.exec("SELECT count(*) FROM " + s + ".recent_failures")[0][0].as<int>(), 30);
    EXPECT_EQ(tx.exec("SELECT pg_catalog.pg_typeof(max_attempts)::text FROM " + s +
                      ".recent_failures LIMIT 1")[0][0]
                  .as<std::string>(),
              "integer");
    EXPECT_EQ(tx.exec("SELECT sum(available + running) FROM " + s + ".queue_stats")[0][0].as<int>(),
              3000);
    EXPECT_EQ(tx.exec("SELECT sum(available) FROM " + s + ".own_depth")[0][0].as<int>(), 2700);
    EXPECT_EQ(tx.exec("SELECT obj_description(" + tx.quote(schema + ".queue_stats") +
                      "::regclass, 'pg_class')")[0][0]
                  .as<std::string>(),
              "per queue");
  }
  // The producer writes what the rules allow and nothing else, and cannot lift them.
  pqxx::connection as_producer(url_as(producer));
  const auto s = as_producer.quote_name(schema);
  const auto refused = [&](const std::string& sql) {
    pqxx::nontransaction tx(as_producer);
    EXPECT_THROW(tx.exec(sql), pqxx::check_violation) << sql;
  };
  refused("INSERT INTO " + s + ".jobs (queue, type, state) VALUES ('q', 'noop', 'done')");
  refused("INSERT INTO " + s + ".jobs (queue, type, max_attempts) VALUES ('q', 'noop', 0)");
  refused("INSERT INTO " + s + ".jobs (queue, type, max_attempts) VALUES ('q', 'noop', 1001)");
  refused("INSERT INTO " + s + ".jobs (queue, type, timeout_ms) VALUES ('q', 'noop', 0)");
  refused("UPDATE " + s + ".jobs SET state = 'finished' WHERE id = 1");
  refused("UPDATE " + s + ".jobs SET max_attempts = max_attempts - 1000 WHERE id = 2");
  {
    pqxx::nontransaction tx(as_producer);
    EXPECT_NO_THROW(
        tx.exec("INSERT INTO " + s +
                ".jobs (queue, type, state, max_attempts, timeout_ms) VALUES "
                "('q', 'noop', 'running', 1000, NULL), ('q', 'noop', 'available', 1, 1)"));
  }
  for (const char* rule : {"job_state DROP CONSTRAINT job_state_check",
                           "job_max_attempts DROP CONSTRAINT job_max_attempts_check",
                           "job_timeout_ms DROP CONSTRAINT job_timeout_ms_check"}) {
    pqxx::nontransaction tx(as_producer);
    EXPECT_THROW(tx.exec("ALTER DOMAIN " + s + "." + rule), pqxx::insufficient_privilege) << rule;
  }
  // Nor may it declare anything over the domains (an operator over job_state would be found
  // before the built-in text operators by a query on a path where it may create objects).
  for (const char* domain : {"job_state", "job_max_attempts", "job_timeout_ms"}) {
    pqxx::nontransaction tx(as_producer);
    EXPECT_THROW(tx.exec("CREATE FUNCTION pg_temp.f(" + s + "." + domain +
                         ") RETURNS boolean LANGUAGE sql AS 'SELECT true'"),
                 pqxx::insufficient_privilege)
        << domain;
  }
  pqxx::nontransaction tx(*conn);
  EXPECT_EQ(tx.exec("SELECT count(*) FROM jobs")[0][0].as<int>(), 3002);
  // The columns' statistics are there for the planner, as before the change of type.
  EXPECT_EQ(
      tx.exec("SELECT count(*) FROM pg_catalog.pg_stats WHERE schemaname = " + tx.quote(schema) +
              " AND tablename = 'jobs' AND attname IN ('state', 'max_attempts', "
              "'timeout_ms')")[0][0]
          .as<int>(),
      3);
}

TEST(Migrations, TheViewsBecomeBarriersKeepingTheirRowsGrantsOptionsAndDependents) {
  // Migration 0023 makes both views security barriers and rewrites recent_failures over a
  // subquery. An upgrade keeps what a deployment set on them: the grant to its dashboard, a
  // comment, an option of its own (CREATE OR REPLACE VIEW alone drops it) and a view over them.
  constexpr int kBefore = 22;
  const std::string schema = unique_schema("migrate_barriers");
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  ASSERT_EQ(detail::migrate(*conn, schema, kBefore), kBefore);
  const auto reader = role_name(schema, "reader");
  const auto s = conn->quote_name(schema);
  {
    pqxx::nontransaction tx(*conn);
    tx.exec("CREATE ROLE " + tx.quote_name(reader) + " LOGIN");
    tx.exec("GRANT USAGE ON SCHEMA " + s + " TO " + tx.quote_name(reader));
    tx.exec("GRANT SELECT ON " + s + ".recent_failures TO " + tx.quote_name(reader));
    tx.exec("COMMENT ON VIEW " + s + ".recent_failures IS 'for the dashboard'");
    tx.exec("ALTER VIEW " + s + ".recent_failures SET (security_invoker = false)");
    tx.exec("CREATE VIEW " + s + ".own_failures AS SELECT id, status FROM " + s +
            ".recent_failures");
    tx.exec("GRANT SELECT ON " + s + ".own_failures TO " + tx.quote_name(reader));
    tx.exec("INSERT INTO jobs (queue, type, last_error) VALUES ('q', 'noop', 'boom')");
    tx.exec(
        "INSERT INTO dead_jobs (id, queue, type, payload, priority, attempts, max_attempts, "
        "created_at, died_at, reason, last_error) VALUES "
        "(901, 'q', 'noop', '{}', 0, 3, 3, now(), now(), 'exhausted', 'boom'), "
        "(902, 'q', 'noop', '{}', 0, 3, 3, now(), now() - interval '2 days', 'exhausted', 'old')");
  }
  const auto rows = [&](pqxx::connection& c) {
    std::string out;
    for (const auto& r : pqxx::nontransaction(c).exec(
             "SELECT id, queue, type, attempts, max_attempts, last_error, next_run_at IS NULL, "
             "status, pg_typeof(max_attempts)::text FROM " +
             s + ".recent_failures ORDER BY id"))
      for (const auto& f : r)
        out +=
            std::string(f.is_null() ? "NULL" : f.c_str()) + (f.num() + 1 < r.size() ? "|" : "\n");
    return out;
  };
  const auto before = rows(*conn);
  ASSERT_EQ(detail::migrate(*conn, schema), detail::latest_schema_version() - kBefore);
  EXPECT_EQ(rows(*conn), before);
  EXPECT_EQ(std::count(before.begin(), before.end(), '\n'), 2) << before;
  pqxx::nontransaction tx(*conn);
  for (const char* view : {"recent_failures", "queue_stats"}) {
    const auto options = tx.exec_params(
        "SELECT o.option_name, o.option_value FROM pg_options_to_table("
        "  (SELECT reloptions FROM pg_class WHERE oid = to_regclass($1))) o ORDER BY 1",
        schema + "." + view);
    std::string text;
    for (const auto& r : options)
      text += std::string(r[0].c_str()) + "=" + r[1].c_str() + " ";
    EXPECT_EQ(text, std::string(view) == "recent_failures"
                        ? "security_barrier=true security_invoker=false "
                        : "security_barrier=true ")
        << view;
  }
  EXPECT_EQ(tx.exec("SELECT obj_description(to_regclass(" + tx.quote(schema + ".recent_failures") +
                    "), 'pg_class')")[0][0]
                .as<std::string>(),
            "for the dashboard");
  pqxx::connection as_reader(url_as(reader));
  EXPECT_EQ(rows(as_reader), before);
  EXPECT_EQ(pqxx::nontransaction(as_reader)
                .exec("SELECT count(*) FROM " + s + ".own_failures")[0][0]
                .as<int>(),
            2);
}

TEST(Migrations, AMigrationBehindAnOpenTransactionGivesUpAppliesNothingAndSaysWhoHoldsIt) {
  // Migration 0022 alters the jobs table, which takes its strongest lock. Behind a session that
  // read jobs and sits idle in its transaction, the migration would wait for as long as that
  // session lives, and every producer and claim would queue behind the migration. It waits the
  // lock wait, then rolls back, naming what waited and who holds the locks.
  constexpr int kBefore = 21;
  const std::string schema = unique_schema("migrate_lock_wait");
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  ASSERT_EQ(detail::migrate(*conn, schema, kBefore), kBefore);
  auto holder =
      detail::connect({.url = database_url(), .schema = schema, .application_name = "long-reader"});
  auto hold = std::make_unique<pqxx::work>(*holder);
  hold->exec("SELECT count(*) FROM jobs");  // its lock on jobs lasts until it ends
  const std::string holder_pid = std::to_string(holder->backendpid());

  std::atomic<bool> done{false};
  std::string error;
  std::thread migrating([&] {
    try {
      auto c = detail::connect({.url = database_url(), .schema = schema});
      detail::migrate(*c, schema, 0, 300ms);
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  const bool gave_up = wait_for([&] { return done.load(); }, 30s);
  if (!gave_up) hold->abort();  // let the migration through rather than hang the test
  migrating.join();
  ASSERT_TRUE(gave_up) << "the migration waited behind the open transaction past 30 s";
  for (const std::string& part :
       {std::string("0022_job_domains"), std::string("nothing was applied"),
        std::string("stays at version 21"), "pid " + holder_pid, std::string("long-reader"),
        std::string("idle in transaction"), std::string("--lock-timeout")}) {
    EXPECT_NE(error.find(part), std::string::npos) << "no '" << part << "' in: " << error;
  }
  EXPECT_EQ(detail::current_schema_version(*conn, schema), kBefore);
  // A transaction on the schema's tables that began after the migration queued (a claim's, an
  // enqueue's) is not named. And a second try says the same, so that a node retrying logs it
  // once.
  const std::string app = "again-" + schema;
  std::string again;
  std::atomic<bool> second_done{false};
  std::thread second([&] {
    try {
      auto c = detail::connect({.url = database_url(), .schema = schema, .application_name = app});
      detail::migrate(*c, schema, 0, 300ms);
    } catch (const std::exception& e) {
      again = e.what();
    }
    second_done = true;
  });
  auto probe = connect(schema);
  const bool queued =
      wait_for([&] { return waiting_for(*probe, app, "relation", 0s) || second_done.load(); }, 30s);
  auto young = detail::connect({.url = database_url(),
                                .schema = schema,
                                .application_name = "young-reader",
                                .statement_timeout_ms = 5000});
  pqxx::work young_tx(*young);
  young_tx.exec("SELECT count(*) FROM queue_state");  // not a table the migration waits for
  second.join();
  young_tx.abort();
  EXPECT_TRUE(queued) << "the second try never waited on the table";
  EXPECT_EQ(again, error) << "a second try's message differs";
  EXPECT_EQ(again.find("young-reader"), std::string::npos) << again;
  EXPECT_EQ(error.find('\n'), std::string::npos) << "one line: " << error;
  // The jobs table kept its constraint-checked columns: 0022 did not half-apply.
  EXPECT_EQ(query_int(*conn, "SELECT count(*) FROM pg_catalog.pg_type t WHERE t.typnamespace = '" +
                                 schema + "'::regnamespace AND t.typtype = 'd'"),
            0);

  hold->commit();
  hold.reset();
  EXPECT_EQ(detail::migrate(*conn, schema, 0, 300ms), detail::latest_schema_version() - kBefore);
  EXPECT_EQ(detail::current_schema_version(*conn, schema), detail::latest_schema_version());
}

TEST(Migrations, AProcessWaitingForAnothersMigrationWaitsPastTheLockWait) {
  // Nodes starting at once: one migrates, the others wait on the migration's advisory lock and
  // then find the work done. That wait is not cut at the lock wait, however long the migration,
  // nor by a lock_timeout the session came with.
  const std::string schema = unique_schema("migrate_wait_other");
  const std::string app = "wait-" + schema;
  auto other = detail::connect({.url = database_url(), .schema = schema});
  auto busy = std::make_unique<pqxx::work>(*other);
  busy->exec_params("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    "baton.migrate/" + schema);
  std::atomic<int> applied{-1};
  std::string error;
  std::thread migrating([&] {
    try {
      // A lock_timeout of the session's own (a role's or a URL's) does not cut it either.
      auto c = detail::connect({.url = database_url(),
                                .schema = schema,
                                .application_name = app,
                                .lock_timeout_ms = 100});
      applied = detail::migrate(*c, schema, 0, 200ms);
    } catch (const std::exception& e) {
      error = e.what();
      applied = -2;
    }
  });
  auto probe = connect(schema);
  const bool waited = wait_for(
      [&] { return applied.load() != -1 || waiting_for(*probe, app, "advisory", 1s); }, 30s);
  const int before_release = applied.load();
  busy->commit();
  busy.reset();
  migrating.join();
  ASSERT_TRUE(waited) << "the migration never waited on the advisory lock";
  EXPECT_EQ(before_release, -1) << "it ended while the other process held the lock: " << error;
  EXPECT_EQ(applied.load(), detail::latest_schema_version()) << error;
}

TEST(Migrations, ALockWaitOfZeroWaitsUntilTheTransactionEnds) {
  constexpr int kBefore = 21;
  const std::string schema = unique_schema("migrate_no_limit");
  const std::string app = "nolimit-" + schema;
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  ASSERT_EQ(detail::migrate(*conn, schema, kBefore), kBefore);
  auto holder = detail::connect({.url = database_url(), .schema = schema});
  auto hold = std::make_unique<pqxx::work>(*holder);
  hold->exec("SELECT count(*) FROM jobs");
  std::atomic<int> applied{-1};
  std::string error;
  std::thread migrating([&] {
    try {
      auto c = detail::connect({.url = database_url(), .schema = schema, .application_name = app});
      applied = detail::migrate(*c, schema, 0, 0ms);
    } catch (const std::exception& e) {
      error = e.what();
      applied = -2;
    }
  });
  auto probe = connect(schema);
  // Waiting on the table's lock for longer than any wait this test would otherwise allow.
  const bool waited = wait_for(
      [&] { return applied.load() != -1 || waiting_for(*probe, app, "relation", 1s); }, 30s);
  const int before_release = applied.load();
  hold->commit();
  migrating.join();
  ASSERT_TRUE(waited) << "the migration never waited on the table lock";
  EXPECT_EQ(before_release, -1) << "it gave up: " << error;
  EXPECT_EQ(applied.load(), detail::latest_schema_version() - kBefore) << error;
}

TEST(Migrations, AMissingSchemaSaysHowToCreateIt) {
  const std::string schema = unique_schema("migrate_missing");
  auto conn = detail::connect({.url = database_url(), .schema = schema});
  try {
    detail::require_current_schema(*conn, schema);
    ADD_FAILURE() << "accepted a schema without tables";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("batonctl migrate"), std::string::npos) << e.what();
  }
}

}  // namespace
