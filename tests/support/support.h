// Test support: the database the harness started, fresh schemas, waiting for states with a
// deadline, real child processes, and a plain HTTP GET for /metrics.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "support/testkit.h"

namespace baton::test {

using namespace std::chrono_literals;

// DATABASE_URL of the PostgreSQL that scripts/test started. Fails the test when unset.
std::string database_url();

// A schema name no other test uses ("t_<what>_<pid>_<salt>_<n>", `what` cut to 19 characters
// so that the whole name fits in 40); baton's tables go there. The schema, and every role named
// "<schema>_..." (role_name and the tests' own role names are), are dropped when the test program
// ends with every test passed, and kept (and named) when one failed.
std::string unique_schema(const std::string& what);
// Marks a schema of a fixed name for the same end as unique_schema's, without its roles.
void track_schema(const std::string& schema);
// At the program's end (support/main.cpp): drops the tracked schemas and their roles from the
// test database when `drop`, else names them on stderr.
void end_tracked_schemas(bool drop);

// A connection with search_path set to `schema`, to `url` (default: the test database).
std::unique_ptr<pqxx::connection> connect(const std::string& schema, const std::string& url = "");

// One value of a query, as text ("" for NULL).
std::string query_value(pqxx::connection& conn, const std::string& sql);
long long query_int(pqxx::connection& conn, const std::string& sql);

}  // namespace baton::test
