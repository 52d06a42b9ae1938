// order_saga: a node running only the order saga's handlers.
//   DATABASE_URL=... order_saga
//   batonctl enqueue --type order_placed --payload '{"order_id":"A1","amount":1999}'
//   batonctl enqueue --type payment_received --payload '{"order_id":"A1"}'
//   batonctl sagas list
#include <baton/baton.h>

#include "example_env.h"
#include "order_saga/order.h"

int main() {
  const auto env = examples::env("order_saga");
  if (!env) return 2;
  try {
    auto config = examples::node_config(*env);
    baton::Node node(config);
    order::register_handlers(node);
    node.run();
  } catch (const std::exception& e) {
    std::cerr << "order_saga: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
