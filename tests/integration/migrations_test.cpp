// Migrations against a real PostgreSQL: once under concurrency, idempotent, newer refused.
#include <gtest/gtest.h>

#include <thread>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/roles.h"
#include "support/support.h"

namespace {

using namespace baton::test;
namespace detail = baton::detail;

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
