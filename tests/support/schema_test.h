// The fixture of integration tests: a schema of the test's own, migrated, and a connection to
// it with helpers to read a number and to wait for one.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/support.h"

namespace baton::test {

class SchemaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = unique_schema(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    detail::migrate(*conn, schema_);
    db_ = connect(schema_);
  }
  long long count(const std::string& sql) { return query_int(*db_, sql); }
  bool wait_count(const std::string& sql, long long want,
                  std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    return wait_for([&] { return count(sql) == want; }, timeout);
  }

  std::string schema_;
  std::unique_ptr<pqxx::connection> db_;
};

}  // namespace baton::test
