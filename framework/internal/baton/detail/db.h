// Database access shared by every part of baton: connecting with the settings each connection
// needs, and the small helpers for identifiers and array parameters.
#pragma once

#include <cstddef>
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
  // Session settings, each fitting the connection's role (0 leaves the server's default):
  int statement_timeout_ms = 0;
  int idle_session_timeout_ms = 0;         // the election session (docs/concepts.md)
  int idle_in_transaction_timeout_ms = 0;  // a transaction left open this long is ended
  int lock_timeout_ms = 0;
  bool synchronous_commit_off = false;
  // Prepared statements planned once per session (force_generic_plan), and no JIT: for the hot
  // statements whose plan does not depend on their values. (A generic plan's estimates, with
  // its LIMIT unknown, pass jit_above_cost: the claim compiled itself for 300 ms every time.)
  // No sequential scan where an index or address scan exists (enable_seqscan off): a plan made
  // once while the queue was nearly empty is kept as the table grows, until the next ANALYZE.
  bool generic_plans = false;
  // No sort where an index gives the order (enable_sort off): the claim session's. A generic
  // claim plan priced a bitmap scan of every due job, sorted, within 2 % of the claim index's
  // ordered scan, and took it after a 5M-job drain (the next 100k jobs drained at 13k/s, each
  // claim reading and sorting the whole backlog). A statement with no other way still sorts,
  // priced at 1e10 and more: set it with generic_plans, whose jit = off keeps such a plan from
  // being compiled each time it runs.
  bool order_from_index = false;
  // The server's own TCP dead-peer detection on this session takes at least this long (the
  // election session: never sooner than its lease).
  int server_keepalive_ms = 0;
  // False: no SET at all (not even search_path), for a connection that may go through a
  // transaction pooler, where a session's SET would reach whichever client gets the server
  // connection next. Its SQL must name the schema (with_schema) or SET LOCAL per transaction.
  bool session_settings = true;
};

// The statement connect() runs on a new session for `options` (search_path and every setting,
// in one round trip); empty when options.session_settings is false. `conn` quotes the schema.
// For benches that open sessions of their own with libpq, as baton's would be.
std::string session_statement(pqxx::connection& conn, const ConnectOptions& options);

// Opens a connection with short client-side TCP bounds (keepalives, tcp_user_timeout, a 2 s
// connect timeout, unless the URL sets them), application_name, search_path and the session
// settings. Throws pqxx::broken_connection (with the password never in the message).
std::unique_ptr<pqxx::connection> connect(const ConnectOptions& options);

// The same, for a node component that must stop on time: CallWatch::abort(owner) ends the wait
// at once (a connect to a network that drops packets would hold it for the connect timeout),
// throwing pqxx::broken_connection. The abandoned attempt finishes on a thread of its own and is
// then closed.
std::unique_ptr<pqxx::connection> connect(const ConnectOptions& options,
                                          std::uintptr_t abort_owner);

// "" when sessions opened with `options` stay one server session each; otherwise why not (a
// transaction pooler such as PgBouncer in pool_mode=transaction hands each transaction to any
// server connection, so session advisory locks, LISTEN and SET do not last) and what to do.
// Opens two connections for the probe, and sets nothing on them. A non-zero `abort_owner` makes
// the probe end at once on CallWatch::abort(abort_owner).
std::string transaction_pooling(const ConnectOptions& options, std::uintptr_t abort_owner = 0);

// Throws baton::ConfigError unless `name` is [a-z_][a-z0-9_]{0,55} (kMaxSchemaName).
void validate_schema_name(std::string_view name);

// Checks a queue, type or schedule name: 1..64 of [A-Za-z0-9_.:-], starting with a letter or
// digit. Throws baton::EnqueueError naming `what` and the rule that was broken.
void validate_name(std::string_view what, std::string_view name);

// A PostgreSQL array literal of integers or doubles, for parameters such as $1::bigint[].
std::string int_array(const std::vector<std::int64_t>& values);
std::string double_array(const std::vector<double>& values);
// A PostgreSQL array literal of strings (each quoted), for parameters such as $1::text[].
std::string text_array(const std::vector<std::string>& values);

// `sql` with every '@' replaced by the schema, validated and double-quoted: for statements that
// name baton's schema explicitly (they may run on a caller's connection and search_path).
std::string with_schema(std::string_view sql, std::string_view schema);

// For a transaction on a caller's session, whose search_path is the caller's: operators and the
// bodies of inlined SQL functions are looked up in it, and an exact match found there beats
// pg_catalog's that needs a cast (bigint * interval, float8 * integer, bigint % integer), so a
// role that may create objects in a schema on that path (public, in databases made before
// PostgreSQL 15) would run its own code as the caller. Sets search_path to baton's schema, then
// pg_temp, until the transaction ends (safe through a transaction pooler).
void search_schema_only(pqxx::transaction_base& tx, std::string_view schema);

// The longest schema name: its channels below must fit PostgreSQL's 63-byte identifiers.
inline constexpr std::size_t kMaxSchemaName = 63 - 7;  // 7: "_leader"

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

// A server error as one line for people: the message, then its DETAIL and HINT, without the
// "ERROR:" prefix and without CONTEXT lines (which only name PL/pgSQL internals).
std::string server_message(const pqxx::sql_error& e);

// True when connecting failed because the server refused the credentials: a wrong password, a
// role that may not log in, no pg_hba.conf entry (libpq reports these as text only).
bool is_authentication_error(const std::exception& e);

// True for errors that mean the connection is gone (as opposed to a bad statement).
bool is_connection_error(const std::exception& e);

}  // namespace baton::detail
