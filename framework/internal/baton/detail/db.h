// Database access shared by every part of baton: connecting with the settings each connection
// needs, and the small helpers for identifiers and array parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/pqxx>

namespace baton::detail {

struct ConnectOptions {
  std::string url{};               // any libpq form
  std::string schema = "baton";    // validated identifier
  std::string application_name{};  // the node id, so a dead node's backends can be found
  // 0 leaves the server default. Set on the election session (see DESIGN.md section 4).
  int statement_timeout_ms = 0;
  int idle_session_timeout_ms = 0;
};

// Opens a connection with short TCP keepalives, application_name and search_path set.
// Throws pqxx::broken_connection (with the password never in the message) when it fails.
std::unique_ptr<pqxx::connection> connect(const ConnectOptions& options);

// Throws baton::ConfigError unless `name` is [a-z_][a-z0-9_]{0,62}.
void validate_schema_name(std::string_view name);

// A PostgreSQL array literal of integers or doubles, for parameters such as $1::bigint[].
std::string int_array(const std::vector<std::int64_t>& values);
std::string double_array(const std::vector<double>& values);

// `sql` with every '@' replaced by the schema, validated and double-quoted: for statements that
// name baton's schema explicitly (they may run on a caller's connection and search_path).
std::string with_schema(std::string_view sql, std::string_view schema);

// The NOTIFY channels of a schema (the schema name is validated, so they are plain identifiers).
inline std::string jobs_channel(std::string_view schema) {
  return std::string(schema) + "_jobs";
}
inline std::string leader_channel(std::string_view schema) {
  return std::string(schema) + "_leader";
}

// The application_name of every session of a node: "<node id>@<schema>". It is how a node's
// backends are found for eviction, and the schema keeps two deployments that share a server
// (and perhaps node names) apart.
inline std::string node_application_name(std::string_view node_id, std::string_view schema) {
  return std::string(node_id) + "@" + std::string(schema);
}

// The message with every "password=..." value replaced by ********, for error messages that may
// echo a mistyped connection string.
std::string scrub(std::string message);

// True for errors that mean the connection is gone (as opposed to a bad statement).
bool is_connection_error(const std::exception& e);

}  // namespace baton::detail
