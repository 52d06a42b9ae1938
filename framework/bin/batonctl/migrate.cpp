// batonctl migrate: brings the schema to this binary's version (safe to run concurrently).
#include <baton/config.h>

#include <chrono>
#include <memory>
#include <string>

#include "baton/detail/migrations.h"
#include "common.h"
#include "output.h"

namespace batonctl {

void add_migrate(CLI::App& app, const Global& g, Command& chosen) {
  auto* cmd = app.add_subcommand("migrate", "apply pending migrations (safe to run concurrently)");
  auto lock_timeout = std::make_shared<std::string>("5s");
  cmd->add_option("--lock-timeout", *lock_timeout,
                  "how long to wait for each lock before giving up, applying nothing (0s: no "
                  "limit); producers and claims on that table wait behind the migration meanwhile")
      ->capture_default_str();
  cmd->callback([&g, &chosen, lock_timeout] {
    chosen = [&g, lock_timeout] {
      const auto wait = baton::parse_duration(*lock_timeout, "lock-timeout");
      // 0 is no limit: a wait that rounds to it would lift the limit it asked for.
      if (wait.count() == 0 && lock_timeout->find_first_of("123456789") != std::string::npos) {
        throw baton::ConfigError("lock-timeout: '" + *lock_timeout +
                                 "' is under 1 ms; use 1ms or more, or 0s to wait as long as it "
                                 "takes");
      }
      if (wait > std::chrono::hours(24)) {
        throw baton::ConfigError("lock-timeout: '" + *lock_timeout +
                                 "' is over 24h; use 24h or less, or 0s to wait as long as it "
                                 "takes");
      }
      auto conn = open(g, false);
      const int applied = baton::detail::migrate(*conn, g.schema, 0, wait);
      const int version = baton::detail::current_schema_version(*conn, g.schema);
      print_result(g.json,
                   "schema " + g.schema + " is at version " + std::to_string(version) +
                       " (applied " + std::to_string(applied) + " migration(s))",
                   {{"schema", g.schema}, {"version", version}, {"applied", applied}});
      return 0;
    };
  });
}

}  // namespace batonctl
