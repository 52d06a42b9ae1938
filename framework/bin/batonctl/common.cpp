// Shared pieces of batonctl (see common.h).
#include "common.h"

#include <pwd.h>
#include <unistd.h>

#include <baton/config.h>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"

namespace batonctl {

std::unique_ptr<pqxx::connection> open(const Global& g, bool current) {
  if (g.database_url.empty()) {
    throw baton::ConfigError("database-url: is required; pass --database-url or set DATABASE_URL");
  }
  baton::describe_database_url(g.database_url);  // validates the form
  auto conn = baton::detail::connect(
      {.url = g.database_url, .schema = g.schema, .application_name = "batonctl"});
  if (current) {
    try {
      baton::detail::require_current_schema(*conn, g.schema);
    } catch (const pqxx::broken_connection&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw Failure(e.what());
    }
  }
  return conn;
}

std::string actor() {
  const passwd* pw = getpwuid(getuid());  // NOLINT(concurrency-mt-unsafe): one thread
  return std::string("batonctl:") + (pw != nullptr ? pw->pw_name : std::to_string(getuid()));
}

int checked_limit(int limit) {
  if (limit < 1 || limit > 100000) {
    throw UsageError("--limit " + std::to_string(limit) + " is out of range; use 1..100000");
  }
  return limit;
}

}  // namespace batonctl
