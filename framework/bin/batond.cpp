// batond: a baton node. It stands for election, leads or waits, runs the leader's maintenance
// (rescue, pruning, the --schedule schedules), serves /metrics and, when asked, the console. It has
// no job handlers of its own (but baton.drill, the failover probe): the jobs of your application
// run on your own node binary, built on the library with the same settings (baton::Settings,
// docs/library.md). Settings: flags, BATON_* variables, a TOML file (--config), defaults.
#include <iostream>

#include <baton/baton.h>
#include <baton/settings.h>

#include "baton/detail/db.h"

int main(int argc, char** argv) {
  baton::Settings settings(
      "batond: a node of a baton cluster. Every node runs the same binary; one leads.");
  if (const auto exit_code = settings.parse(argc, argv)) return *exit_code;
  try {
    baton::Node node(settings.node());
    settings.apply(node);
    node.run();
  } catch (const baton::ConfigError& e) {
    std::cerr << "batond: bad setting: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "batond: " << baton::detail::scrub(e.what()) << "\n";
    return 1;
  }
  return 0;
}
