// Built-in handlers: noop, sleep, fail.
#include "builtin/builtin.h"

#include <thread>

namespace builtin {

void register_handlers(baton::Node& node) {
  node.handle("noop", [](baton::JobContext&) {});
  node.handle("sleep", [](baton::JobContext& ctx) {
    const auto payload = ctx.payload();
    const auto ms = payload.is_object() ? payload.value("ms", 0) : 0;
    if (ms < 0 || ms > 3'600'000) throw baton::Discard("sleep: ms must be 0..3600000");
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until && !ctx.cancelled()) {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          until - std::chrono::steady_clock::now(), std::chrono::milliseconds(10)));
    }
    if (ctx.cancelled()) throw std::runtime_error("sleep: cancelled before it finished");
  });
  node.handle("fail", [](baton::JobContext& ctx) {
    const auto payload = ctx.payload();
    throw std::runtime_error(payload.is_object() ? payload.value("message", "asked to fail")
                                                 : "asked to fail");
  });
}

}  // namespace builtin
