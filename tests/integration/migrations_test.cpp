// Migrations against a real PostgreSQL: once under concurrency, idempotent, newer refused.
#include <gtest/gtest.h>

#include <thread>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
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
