// email_sender: a user's own node in a few lines. It runs the send_email handler; enqueue with
//   batonctl enqueue --type send_email --payload '{"to":"a@example.com","subject":"hi"}'
#include <cstdlib>
#include <iostream>

#include <baton/baton.h>

#include "email_sender/email.h"

int main(int argc, char** argv) {
  const char* url = std::getenv("DATABASE_URL");
  if (url == nullptr) {
    std::cerr << "email_sender: set DATABASE_URL (e.g. postgresql://user@127.0.0.1:5432/db)\n";
    return 2;
  }
  try {
    baton::NodeConfig config;
    config.database_url = url;
    config.metrics_listen = "127.0.0.1:0";
    baton::Node node(config);
    email::register_handlers(node, argc > 1 ? argv[1] : "outbox");
    node.run();  // until SIGTERM or Ctrl-C
  } catch (const std::exception& e) {
    std::cerr << "email_sender: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
