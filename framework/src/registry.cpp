// Handler registry: one handler per type, fixed before the node runs.
#include "baton/detail/registry.h"

#include <algorithm>
#include <stdexcept>

namespace baton::detail {

void HandlerRegistry::add(const std::string& type, Handler handler,
                          std::optional<RetryPolicy> retry) {
  if (!handler) throw std::logic_error("handler for '" + type + "' is empty");
  insert(type, HandlerEntry{std::move(handler), nullptr, retry});
}

void HandlerRegistry::add(const std::string& type, TxHandler handler,
                          std::optional<RetryPolicy> retry) {
  if (!handler) throw std::logic_error("handler for '" + type + "' is empty");
  insert(type, HandlerEntry{nullptr, std::move(handler), retry});
}

void HandlerRegistry::insert(const std::string& type, HandlerEntry entry) {
  if (frozen_) {
    throw std::logic_error("handler for '" + type +
                           "' registered after run(); register every handler before run()");
  }
  if (!handlers_.emplace(type, std::move(entry)).second) {
    throw std::logic_error("a handler for job type '" + type +
                           "' is registered already; each type has exactly one handler");
  }
}

std::vector<std::string> HandlerRegistry::types() const {
  std::vector<std::string> out;
  out.reserve(handlers_.size());
  for (const auto& [type, entry] : handlers_)
    out.push_back(type);
  std::sort(out.begin(), out.end());
  return out;
}

const HandlerEntry* HandlerRegistry::find(const std::string& type) const {
  auto it = handlers_.find(type);
  return it == handlers_.end() ? nullptr : &it->second;
}

}  // namespace baton::detail
