// What every batonctl command shares: the global options, the connection, the errors that pick
// the exit code, and the registration of each command group (one file each).
//
// Exit codes: 0 done, 1 failed (database, not found, refused), 2 bad usage (a flag, a value).
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <pqxx/pqxx>

namespace batonctl {

struct Global {
  std::string database_url;  // --database-url, default $DATABASE_URL
  std::string schema = "baton";
  bool json = false;
};

// Bad usage: exit 2, with the message.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The command could not do what was asked (nothing found, refused): exit 1, with the message.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A connection to the deployment; with `current`, the schema must be at this binary's version.
std::unique_ptr<pqxx::connection> open(const Global& g, bool current = true);

// Who batonctl says it is in the rows it writes: "batonctl:<os user>".
std::string actor();

// The command chosen on the command line, run after parsing. Returns the exit code.
using Command = std::function<int()>;

// Each command group registers its subcommands and owns their options; when one of them is
// parsed, it sets `chosen`.
void add_migrate(CLI::App& app, const Global& g, Command& chosen);
void add_enqueue(CLI::App& app, const Global& g, Command& chosen);
void add_drill(CLI::App& app, const Global& g, Command& chosen);
void add_inspect(CLI::App& app, const Global& g, Command& chosen);  // stats leader nodes ...
void add_jobs(CLI::App& app, const Global& g, Command& chosen);
void add_queues(CLI::App& app, const Global& g, Command& chosen);
void add_dead(CLI::App& app, const Global& g, Command& chosen);

// A positive limit from --limit.
int checked_limit(int limit);

}  // namespace batonctl
