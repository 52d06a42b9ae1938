// Order saga handlers (see order.h).
#include "order_saga/order.h"

#include <spdlog/spdlog.h>

namespace order {

void to_json(nlohmann::json& j, const OrderSaga& s) {
  j = {{"order_id", s.order_id}, {"amount", s.amount}, {"state", s.state}};
}

void from_json(const nlohmann::json& j, OrderSaga& s) {
  j.at("order_id").get_to(s.order_id);
  s.amount = j.value("amount", 0L);
  j.at("state").get_to(s.state);
}

void register_handlers(baton::Node& node) {
  const baton::SagaStore sagas = node.sagas();
  const baton::ClientOptions client{.schema = node.config().schema};
  auto order_id = [](baton::JobContext& ctx) {
    const auto p = ctx.payload();
    if (!p.contains("order_id") || !p["order_id"].is_string()) {
      throw baton::Discard("payload has no order_id string");
    }
    return p["order_id"].get<std::string>();
  };

  node.handle_tx("order_placed", [=](baton::JobContext& ctx, pqxx::work& tx) {
    const auto id = order_id(ctx);
    if (sagas.find<OrderSaga>(tx, "order_id", id)) return;  // a duplicate message
    baton::Saga<OrderSaga> saga;
    saga.data = {id, ctx.payload().value("amount", 0L), "awaiting_payment"};
    sagas.save(tx, saga);
    // The saga's timeout is an ordinary job, due when the payment window closes.
    baton::EnqueueOptions later;
    later.delay = std::chrono::milliseconds(ctx.payload().value("pay_within_ms", 30 * 60 * 1000));
    baton::enqueue_in(tx, {{"payment_timeout", {{"order_id", id}}, later}}, client);
  });

  node.handle_tx("payment_received", [=](baton::JobContext& ctx, pqxx::work& tx) {
    const auto id = order_id(ctx);
    auto saga = sagas.find<OrderSaga>(tx, "order_id", id);
    if (!saga) throw baton::Discard("no open order " + id + " (unknown, or already finished)");
    if (saga->data.state != "awaiting_payment") return;
    saga->data.state = "paid";
    sagas.save(tx, *saga);
    baton::enqueue_in(tx, {{"ship_order", {{"order_id", id}}, {}}}, client);
  });

  node.handle_tx("ship_order", [=](baton::JobContext& ctx, pqxx::work& tx) {
    auto saga = sagas.find<OrderSaga>(tx, "order_id", order_id(ctx));
    if (!saga || saga->data.state != "paid") return;
    saga->data.state = "shipped";
    sagas.complete(tx, *saga);
  });

  node.handle_tx("payment_timeout", [=](baton::JobContext& ctx, pqxx::work& tx) {
    auto saga = sagas.find<OrderSaga>(tx, "order_id", order_id(ctx));
    if (!saga || saga->data.state != "awaiting_payment") return;  // paid in time
    saga->data.state = "cancelled";
    sagas.complete(tx, *saga);
    spdlog::info("order cancelled: order_id={} unpaid in time", saga->data.order_id);
  });
}

}  // namespace order
