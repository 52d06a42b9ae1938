// batonctl: the operator's CLI. One file per command group; this one parses, dispatches and turns
// what went wrong into a message and an exit code: 0 done, 1 failed, 2 bad usage.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>

#include <baton/admin.h>
#include <baton/client.h>
#include <baton/config.h>

#include "baton/detail/db.h"
#include "baton/detail/text.h"
#include "common.h"

namespace {

// The first word on the command line that is not an option or an option's value, if any.
std::string first_word(int argc, char** argv) {
  static const std::set<std::string> with_value{"--database-url", "--schema"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (with_value.count(arg) != 0) {
      ++i;
      continue;
    }
    if (!arg.empty() && arg[0] != '-') return arg;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"batonctl: operate a baton deployment (exit codes: 0 done, 1 failed, 2 bad usage)"};
  app.require_subcommand(1);
  batonctl::Global g;
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read once, before any thread starts
  if (const char* url = std::getenv("DATABASE_URL")) g.database_url = url;
  app.add_option("--database-url", g.database_url,
                 "libpq connection string; default $DATABASE_URL");
  app.add_option("--schema", g.schema, "schema holding baton's tables (the last one given wins)")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--json", g.json, "print JSON instead of a table");

  batonctl::Command chosen;
  batonctl::add_migrate(app, g, chosen);
  batonctl::add_enqueue(app, g, chosen);
  batonctl::add_inspect(app, g, chosen);
  batonctl::add_jobs(app, g, chosen);
  batonctl::add_queues(app, g, chosen);
  batonctl::add_dead(app, g, chosen);
  batonctl::add_drill(app, g, chosen);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help
  } catch (const CLI::ParseError& e) {
    const std::string word = first_word(argc, argv);
    const auto commands = app.get_subcommands([](const CLI::App*) { return true; });
    if (!word.empty() && std::none_of(commands.begin(), commands.end(),
                                      [&](const CLI::App* s) { return s->get_name() == word; })) {
      std::string names;
      for (const auto* s : commands)
        names += (names.empty() ? "" : ", ") + s->get_name();
      std::cerr << "batonctl: unknown command '" << word << "'; the commands are " << names
                << " (batonctl --help)\n";
    } else {
      std::cerr << "batonctl: " << e.what() << " (batonctl " << (word.empty() ? "" : word + " ")
                << "--help)\n";
    }
    return 2;
  }

  try {
    return chosen ? chosen() : 2;
  } catch (const batonctl::UsageError& e) {
    std::cerr << "batonctl: " << e.what() << "\n";
    return 2;
  } catch (const baton::ConfigError& e) {
    std::cerr << "batonctl: bad setting: " << baton::detail::scrub(e.what()) << "\n";
    return 2;
  } catch (const baton::EnqueueError& e) {
    std::cerr << "batonctl: " << baton::detail::scrub(e.what()) << "\n";
    return 2;
  } catch (const baton::AdminError& e) {
    std::cerr << "batonctl: " << e.what() << "\n";
    return 2;
  } catch (const batonctl::Failure& e) {
    std::cerr << "batonctl: " << e.what() << "\n";
    return 1;
  } catch (const pqxx::broken_connection& e) {
    std::cerr << "batonctl: cannot reach the database: "
              << baton::detail::one_line(baton::detail::scrub(e.what()))
              << "; check --database-url / DATABASE_URL and that PostgreSQL is running\n";
    return 1;
  } catch (const pqxx::sql_error& e) {
    std::cerr << "batonctl: " << baton::detail::server_message(e) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "batonctl: " << baton::detail::scrub(e.what()) << "\n";
    return 1;
  }
}
