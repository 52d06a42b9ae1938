// The handlers a node runs, by job type. Filled before the node runs, read-only after: lookups
// from many threads need no lock once frozen.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include <optional>

#include "baton/detail/retry_policy.h"
#include "baton/handler.h"

namespace baton::detail {

// One of the two is set.
struct HandlerEntry {
  Handler plain;
  TxHandler transactional;
  std::optional<RetryPolicy> retry;  // the node's policy when unset
};

class HandlerRegistry {
 public:
  // Throws std::logic_error when the type is registered already, or after freeze().
  void add(const std::string& type, Handler handler, std::optional<RetryPolicy> retry = {});
  void add(const std::string& type, TxHandler handler, std::optional<RetryPolicy> retry = {});
  const HandlerEntry* find(const std::string& type) const;
  void freeze() { frozen_ = true; }
  std::size_t size() const { return handlers_.size(); }
  // The registered types, sorted.
  std::vector<std::string> types() const;

 private:
  void insert(const std::string& type, HandlerEntry entry);

  std::unordered_map<std::string, HandlerEntry> handlers_;
  bool frozen_ = false;
};

}  // namespace baton::detail
