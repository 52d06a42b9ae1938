// Leadership events: a node is granted leadership with a new epoch, and loses it for a reason.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace baton {

enum class RevokeReason {
  lost_renewal,     // the heartbeat failed to renew within the ttl, or renewed zero rows
  connection_lost,  // the election connection broke
  evicted,          // another node ended this node's sessions after its lease expired
  stepped_down,     // yield(): the node gave up leadership on purpose
  shutting_down,    // the node is stopping
};

std::string_view to_string(RevokeReason reason);

// Callbacks run on the elector's event thread, never on the heartbeat's.
struct LeadershipCallbacks {
  std::function<void(std::int64_t epoch)> on_granted;
  std::function<void(std::int64_t epoch, RevokeReason reason)> on_revoked;
};

}  // namespace baton
