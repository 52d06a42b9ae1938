// The order saga example: OrderPlaced -> PaymentReceived -> Shipped, with a payment timeout.
// Every step is a transactional handler: it loads the saga (locked), changes it and enqueues the
// next step in the job's own transaction, so a step's effects commit exactly once.
//
//   order_placed     {"order_id": "A1", "amount": 1999, "pay_within_ms": 1800000}
//   payment_received {"order_id": "A1"}
//   (ship_order and payment_timeout are enqueued by the saga itself)
#pragma once

#include <string>
#include <vector>

#include <baton/baton.h>

namespace order {

struct OrderSaga {
  static constexpr const char* saga_type = "order";
  static std::vector<std::string> indexed() { return {"order_id"}; }
  std::string order_id;
  long amount = 0;
  std::string state;  // awaiting_payment, paid, shipped, cancelled
};

void to_json(nlohmann::json& j, const OrderSaga& s);
void from_json(const nlohmann::json& j, OrderSaga& s);

void register_handlers(baton::Node& node);

}  // namespace order
