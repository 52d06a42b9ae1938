// Roles for tests of privileges and hostile neighbours: the database as another role, and the
// grant blocks the docs publish, for a test's schema and role.
#pragma once

#include <string>

namespace baton::test {

// The test database's URL (key=value form) as `role`, trusted by the throwaway server.
std::string url_as(const std::string& role);

// A role name unique to the test's schema (at most 63 bytes).
std::string role_name(const std::string& schema, const std::string& what);

// The SQL between "-- <block>:begin" and "-- <block>:end" in docs/<doc>, with the schema `baton`
// and the role `placeholder` replaced.
std::string documented_block(const std::string& doc, const std::string& block,
                             const std::string& placeholder, const std::string& schema,
                             const std::string& role);

}  // namespace baton::test
