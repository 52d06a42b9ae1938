// email_sender: a user's own node in a few lines. It runs the send_email handler, writing one
// .eml file per job into the outbox directory (first argument, default ./outbox).
//   DATABASE_URL=... email_sender /tmp/outbox
//   batonctl enqueue --type send_email --payload '{"to":"a@example.com","subject":"hi"}'
#include <baton/baton.h>

#include "email_sender/email.h"
#include "example_env.h"

int main(int argc, char** argv) {
  const auto env = examples::env("email_sender");
  if (!env) return 2;
  try {
    auto config = examples::node_config(*env);
    baton::Node node(config);
    email::register_handlers(node, argc > 1 ? argv[1] : "outbox");
    node.run();  // until SIGTERM or Ctrl-C
  } catch (const std::exception& e) {
    std::cerr << "email_sender: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
