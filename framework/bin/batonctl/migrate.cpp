// batonctl migrate: brings the schema to this binary's version (safe to run concurrently).
#include "baton/detail/migrations.h"
#include "common.h"
#include "output.h"

namespace batonctl {

void add_migrate(CLI::App& app, const Global& g, Command& chosen) {
  auto* cmd = app.add_subcommand("migrate", "apply pending migrations (safe to run concurrently)");
  cmd->callback([&g, &chosen] {
    chosen = [&g] {
      auto conn = open(g, false);
      const int applied = baton::detail::migrate(*conn, g.schema);
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
