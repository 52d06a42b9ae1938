// Applies the embedded migrations to a schema, once, however many processes try at the same time.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include <pqxx/pqxx>

namespace baton::detail {

// The newest version this binary knows.
int latest_schema_version();

// How long a migration waits for any one lock it needs (on a table, a view, a function) before
// it gives up: while it waits behind a long transaction, every session that wants that table
// (producers, the leader's claims) queues behind it. A node that migrates at start retries.
inline constexpr std::chrono::milliseconds kMigrationLockWait{5'000};
// A node's migration at start waits less, and tries again only after kMigrationRetry: several
// nodes starting at once each take their turn at the locks, and each turn holds up the queue.
inline constexpr std::chrono::milliseconds kNodeMigrationLockWait{1'000};
inline constexpr std::chrono::milliseconds kMigrationRetry{20'000};  // drawn from 10-20 s

// A migration that gave up waiting for a lock: nothing was applied.
class MigrationLockWait : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Applies every missing migration under a transaction-level advisory lock keyed on the schema,
// all in one transaction, each with its row in schema_migrations. Returns how many it applied
// (0 when current). Throws std::runtime_error when the database is newer than this binary.
// `up_to` > 0 stops after that version (a test's schema as an older release left it); a schema
// already past it is left as it is; an `up_to` newer than this binary knows is refused
// (std::invalid_argument).
// Each lock the migrations take waits at most `lock_wait` (0: as long as it takes); past it the
// whole transaction rolls back, nothing applied, and MigrationLockWait names the migration that
// waited and the sessions holding locks in the schema. The advisory lock is waited for without
// a limit: another process is migrating, and this one then finds its work done.
int migrate(pqxx::connection& conn, const std::string& schema, int up_to = 0,
            std::chrono::milliseconds lock_wait = kMigrationLockWait);

// The schema's applied version (0 when baton was never installed there).
int current_schema_version(pqxx::connection& conn, const std::string& schema);

// Throws std::runtime_error with the fix when the schema is missing, older or newer.
void require_current_schema(pqxx::connection& conn, const std::string& schema);

// Throws std::runtime_error naming every table privilege a node needs and this role lacks.
void require_privileges(pqxx::connection& conn, const std::string& schema);

}  // namespace baton::detail
