// demo_node: a baton node with the examples' handlers, for the demo, the drills, the benchmarks
// and the cluster tests. It takes every setting batond takes (baton::Settings), plus --outbox.
//   noop, sleep, fail, record_tx, record_ext,  drills, benchmarks and tests (examples/builtin)
//   record_run
//   send_email                                 the email example (written to --outbox)
//   order_placed, payment_received, ...        the order saga example
#include <iostream>

#include <baton/baton.h>
#include <baton/settings.h>

#include "builtin/builtin.h"
#include "email_sender/email.h"
#include "order_saga/order.h"

int main(int argc, char** argv) {
  baton::Settings settings(
      "demo_node: a baton node with the examples' handlers (noop, sleep, fail, record_tx, "
      "record_ext, record_run, send_email, the order saga), for demos, drills and benchmarks.");
  std::string outbox;
  std::string run_log;
  settings.add("outbox", "directory where send_email writes messages (default: the log)", &outbox);
  settings.add("run-log", "file where record_run appends one line per start and end of a run",
               &run_log);
  if (const auto exit_code = settings.parse(argc, argv)) return *exit_code;
  try {
    baton::Node node(settings.node());
    builtin::register_handlers(node, run_log);
    email::register_handlers(node, outbox);
    order::register_handlers(node);
    settings.apply(node);
    node.run();
  } catch (const baton::ConfigError& e) {
    std::cerr << "demo_node: bad setting: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "demo_node: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
