// Settings: a node's settings read the way batond reads them, for your own node binary. Each
// setting comes from, in this order of precedence: a flag (--threads 4), the environment
// (BATON_THREADS=4; DATABASE_URL too for the database), a TOML file given with --config (a key of
// the flag's name: `threads = 4`), the default. Every source goes through the same parser, so a
// bad value gets the same message wherever it came from, naming the setting and the source.
//
//   int main(int argc, char** argv) {
//     baton::Settings settings("my-node: sends the mail of my-app");
//     std::string outbox;
//     settings.add("outbox", "where mail goes", &outbox);  // --outbox, BATON_OUTBOX, `outbox`
//     if (const auto exit_code = settings.parse(argc, argv)) return *exit_code;
//     baton::Node node(settings.node());
//     node.handle("send_email", ...);
//     settings.apply(node);  // --schedule schedules, --log-level, --log-format
//     node.run();
//   }
//
// Not thread-safe; use it from main() before starting anything.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "baton/config.h"

namespace baton {

class Node;

class Settings {
 public:
  // `description` opens --help.
  explicit Settings(std::string description);
  ~Settings();
  Settings(const Settings&) = delete;
  Settings& operator=(const Settings&) = delete;

  // An application setting, read like the node's own (flag --name, BATON_NAME, TOML `name`), into
  // `value` (which keeps its default when no source sets it). Call before parse().
  void add(const std::string& name, const std::string& help, std::string* value);

  // Reads every source. Returns nullopt when the program should go on; otherwise the code it
  // should exit with: 0 after --help or --print-config (printed to stdout), 2 after a bad
  // setting (its message printed to stderr: which setting, from which source, what to do).
  std::optional<int> parse(int argc, char** argv);

  // The node's settings, validated (node_id stays empty when not set: the Node fills it).
  const NodeConfig& node() const;

  // Declares the schedules given with --schedule on `node` and configures logging (--log-level,
  // --log-format) with the node's id. Call after registering handlers, before node.run().
  void apply(Node& node) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
