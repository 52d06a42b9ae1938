// Migrations: embedded SQL applied in one transaction under an advisory lock keyed on the schema,
// so that ten nodes starting at once migrate exactly once and the others find it done.
#include "baton/detail/migrations.h"

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "baton/detail/db.h"
#include "baton/detail/migrations_data.h"
#include "baton/detail/text.h"

namespace baton::detail {
namespace {

constexpr const char* kLockSql = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

int read_version(pqxx::transaction_base& tx, const std::string& schema) {
  // schema_migrations may not exist yet; ask the catalog first so the query never fails.
  auto exists = tx.exec_params(
      "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND "
      "tablename = 'schema_migrations'",
      schema);
  if (exists.empty()) return 0;
  return tx
      .exec("SELECT coalesce(max(version), 0) FROM " + tx.quote_name(schema) +
            ".schema_migrations")[0][0]
      .as<int>();
}

// The migration that adds enqueue(text, text, text), which every role may execute.
constexpr int kThreeArgumentEnqueue = 21;

// The sessions that may hold what a migration waited for: those holding a lock on one of the
// schema's relations in this database in a transaction older than the lock wait ($2, in ms),
// oldest first (younger ones, a claim or an enqueue, began after the migration queued). Their
// transactions' starts, not their ages, so that a node retrying logs the same message again
// only when it changes. At most ten; then how many more.
constexpr const char* kLockHoldersSql = R"sql(
WITH holders AS (
  SELECT a.pid, a.usename, a.application_name, a.state, a.xact_start
    FROM pg_catalog.pg_stat_activity a
   WHERE a.pid <> pg_catalog.pg_backend_pid()
     AND a.datname = pg_catalog.current_database()
     AND a.xact_start <= pg_catalog.clock_timestamp() - $2::bigint * interval '1 millisecond'
     AND a.pid IN (SELECT l.pid FROM pg_catalog.pg_locks l
                     JOIN pg_catalog.pg_class c ON c.oid = l.relation
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                    WHERE l.granted AND n.nspname = $1
                      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                         WHERE d.datname = pg_catalog.current_database())))
SELECT (SELECT pg_catalog.string_agg(pg_catalog.format(
                 'pid %s (role %L, application %L, %s; its transaction began %s UTC)', h.pid,
                 h.usename, h.application_name, coalesce(h.state, 'state hidden'),
                 pg_catalog.to_char(h.xact_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')),
               '; ' ORDER BY h.xact_start, h.pid)
          FROM (SELECT * FROM holders ORDER BY xact_start, pid LIMIT 10) h),
       (SELECT count(*) FROM holders)
)sql";

std::string duration_text(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? std::to_string(d.count() / 1000) + " s"
                               : std::to_string(d.count()) + " ms";
}

std::string lock_wait_message(pqxx::connection& conn, const std::string& schema,
                              const std::string& waiting, int version,
                              std::chrono::milliseconds lock_wait) {
  std::string holders;
  try {
    pqxx::read_transaction tx(conn);
    const auto r =
        tx.exec_params(kLockHoldersSql, schema, static_cast<std::int64_t>(lock_wait.count()));
    const auto listed = r[0][0].is_null() ? std::string() : r[0][0].as<std::string>();
    const auto count = r[0][1].as<std::int64_t>();
    holders = listed.empty()
                  ? "No session holds a lock there in a transaction older than the wait now."
                  : "Sessions holding locks there: " + listed +
                        (count > 10 ? " and " + std::to_string(count - 10) + " more" : "") + ".";
  } catch (const std::exception& e) {
    // The message is still the news; the list is a help.
    holders = "The sessions holding locks could not be listed (" + one_line(e.what()) + ").";
  }
  // Role and application names are any text their sessions chose: one line, no secrets.
  return one_line(
      scrub(waiting + " waited " + duration_text(lock_wait) + " for a lock in schema '" + schema +
            "' and gave up; nothing was applied (the schema stays at version " +
            std::to_string(version) + "). " + holders +
            " Migrate again once those transactions end (a session idle in a transaction holds its "
            "locks until it ends; pg_terminate_backend(pid) ends it), or allow a longer wait "
            "(batonctl migrate --lock-timeout 1m; 0s waits as long as it takes)"),
      4000);
}

}  // namespace

int latest_schema_version() {
  const auto& all = embedded_migrations();
  return all.empty() ? 0 : all.back().version;
}

int current_schema_version(pqxx::connection& conn, const std::string& schema) {
  pqxx::read_transaction tx(conn);
  return read_version(tx, schema);
}

int migrate(pqxx::connection& conn, const std::string& schema, int up_to,
            std::chrono::milliseconds lock_wait) {
  if (lock_wait.count() < 0 || lock_wait.count() > std::numeric_limits<int>::max()) {
    throw std::invalid_argument("migrate: the lock wait must be 0 (no limit) to " +
                                std::to_string(std::numeric_limits<int>::max()) + " ms");
  }
  std::string waiting;  // what the transaction is applying, for the lock wait's message
  int current = 0;
  try {
    pqxx::work tx(conn);
    // Another process's migration is waited for as long as it takes, whatever lock_timeout the
    // role, the database or the connection string set.
    tx.exec("SET LOCAL lock_timeout = 0");
    tx.exec_params(kLockSql, "baton.migrate/" + schema);
    current = read_version(tx, schema);
    const int latest = latest_schema_version();
    if (current > latest) {
      throw std::runtime_error("schema '" + schema + "' is at version " + std::to_string(current) +
                               ", newer than this binary knows (" + std::to_string(latest) +
                               "); upgrade baton on this node before starting it");
    }
    if (up_to > latest) {
      throw std::invalid_argument("migrate: version " + std::to_string(up_to) +
                                  " is newer than this binary knows (" + std::to_string(latest) +
                                  ")");
    }
    const int target = up_to > 0 ? up_to : latest;
    // Current already: nothing to create, so a role that owns nothing (a node's) gets no error.
    if (current >= target) return 0;
    // Past the advisory lock: every other lock waits at most lock_wait.
    tx.exec("SET LOCAL lock_timeout = " + std::to_string(lock_wait.count()));
    const std::string q = tx.quote_name(schema);
    waiting = "setting up schema " + schema;
    tx.exec("CREATE SCHEMA IF NOT EXISTS " + q);
    detail::search_schema_only(tx, schema);  // and pg_temp last, not first
    tx.exec(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())");
    int applied = 0;
    for (const auto& m : embedded_migrations()) {
      if (m.version <= current) continue;
      if (m.version > target) break;
      waiting = "migration " + std::string(m.name);
      tx.exec(std::string(m.sql));
      tx.exec_params("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version,
                     std::string(m.name));
      ++applied;
    }
    waiting = "the grants after the migrations";
    // Nobody calls baton's functions without a grant (PUBLIC has EXECUTE on every new function
    // by default, and a migration may have added some).
    tx.exec("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA " + q + " FROM PUBLIC");
    // Except the three-argument enqueue (migration 0021): SECURITY INVOKER, it only calls the
    // nine-argument one, whose EXECUTE is checked for its caller.
    if (target >= kThreeArgumentEnqueue) {
      tx.exec("GRANT EXECUTE ON FUNCTION " + q + ".enqueue(text, text, text) TO PUBLIC");
    }
    tx.commit();
    return applied;
  } catch (const pqxx::sql_error& e) {
    // lock_not_available: the lock timeout, after the transaction rolled back.
    if (e.sqlstate() != "55P03" || waiting.empty()) throw;
    throw MigrationLockWait(lock_wait_message(conn, schema, waiting, current, lock_wait));
  }
}

void require_current_schema(pqxx::connection& conn, const std::string& schema) {
  const int current = current_schema_version(conn, schema);
  const int latest = latest_schema_version();
  if (current == latest) return;
  if (current == 0) {
    throw std::runtime_error("schema '" + schema +
                             "' has no baton tables; run 'batonctl migrate' (or start a node "
                             "with --migrate)");
  }
  if (current < latest) {
    throw std::runtime_error("schema '" + schema + "' is at version " + std::to_string(current) +
                             ", this binary needs " + std::to_string(latest) +
                             "; run 'batonctl migrate'");
  }
  throw std::runtime_error("schema '" + schema + "' is at version " + std::to_string(current) +
                           ", newer than this binary knows (" + std::to_string(latest) +
                           "); upgrade baton on this node");
}

void require_privileges(pqxx::connection& conn, const std::string& schema) {
  // What a node does to each table (docs/security.md lists the same grants).
  constexpr const char* kMissingSql = R"sql(
SELECT string_agg(missing, ', ') FROM (
SELECT privilege || ' on ' || $1 || '.' || tab AS missing
  FROM (VALUES ('jobs', 'SELECT'), ('jobs', 'INSERT'), ('jobs', 'UPDATE'), ('jobs', 'DELETE'),
               ('job_history', 'SELECT'), ('job_history', 'INSERT'), ('job_history', 'DELETE'),
               ('dead_jobs', 'SELECT'), ('dead_jobs', 'INSERT'), ('dead_jobs', 'DELETE'),
               ('locks', 'SELECT'), ('locks', 'INSERT'), ('locks', 'UPDATE'),
               ('nodes', 'SELECT'), ('nodes', 'INSERT'), ('nodes', 'UPDATE'),
               ('queue_state', 'SELECT'), ('settings', 'SELECT'),
               ('control_requests', 'SELECT'), ('control_requests', 'UPDATE'),
               ('periodic_schedules', 'SELECT'), ('periodic_schedules', 'INSERT'),
               ('periodic_schedules', 'UPDATE'),
               ('sagas', 'SELECT'), ('sagas', 'INSERT'), ('sagas', 'UPDATE'), ('sagas', 'DELETE'),
               ('saga_index', 'SELECT'), ('saga_index', 'INSERT'), ('saga_index', 'DELETE'),
               ('leadership_events', 'SELECT'), ('leadership_events', 'INSERT'),
               ('leadership_events', 'DELETE'),
               ('queue_gates', 'SELECT'), ('queue_gates', 'INSERT'), ('queue_gates', 'UPDATE'))
       AS need(tab, privilege)
 WHERE NOT has_table_privilege(quote_ident($1) || '.' || tab, privilege)
UNION ALL
SELECT 'USAGE, UPDATE on sequence ' || $1 || '.epochs'
 WHERE NOT (has_sequence_privilege(quote_ident($1) || '.epochs', 'USAGE')
            AND has_sequence_privilege(quote_ident($1) || '.epochs', 'UPDATE'))
UNION ALL
SELECT 'EXECUTE on function ' || $1 || '.' || fn
  FROM (VALUES ('shard_of(text, integer)'), ('prune_history(bigint, integer)'),
               ('summarize_history(bigint, integer)')) AS f(fn)
 WHERE NOT has_function_privilege(quote_ident($1) || '.' || fn, 'EXECUTE')) m
)sql";
  pqxx::read_transaction tx(conn);
  auto r = tx.exec_params(kMissingSql, schema);
  if (!r[0][0].is_null()) {
    const auto role = tx.exec("SELECT current_user")[0][0].as<std::string>();
    throw std::runtime_error("role " + role + " lacks " + r[0][0].as<std::string>() +
                             "; grant them (docs/security.md lists every grant a node needs)");
  }
}

}  // namespace baton::detail
