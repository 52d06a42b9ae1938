// Applies the embedded migrations to a schema, once, however many processes try at the same time.
#pragma once

#include <pqxx/pqxx>

namespace baton::detail {

// The newest version this binary knows.
int latest_schema_version();

// Applies every missing migration under a transaction-level advisory lock keyed on the schema,
// all in one transaction, each with its row in schema_migrations. Returns how many it applied
// (0 when current). Throws std::runtime_error when the database is newer than this binary.
// `up_to` > 0 stops after that version (a test's schema as an older release left it); a schema
// already past it is left as it is; an `up_to` newer than this binary knows is refused
// (std::invalid_argument).
int migrate(pqxx::connection& conn, const std::string& schema, int up_to = 0);

// The schema's applied version (0 when baton was never installed there).
int current_schema_version(pqxx::connection& conn, const std::string& schema);

// Throws std::runtime_error with the fix when the schema is missing, older or newer.
void require_current_schema(pqxx::connection& conn, const std::string& schema);

// Throws std::runtime_error naming every table privilege a node needs and this role lacks.
void require_privileges(pqxx::connection& conn, const std::string& schema);

}  // namespace baton::detail
