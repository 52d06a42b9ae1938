// Names of revoke reasons, as they appear in logs and metric labels.
#include "baton/events.h"

namespace baton {

std::string_view to_string(RevokeReason reason) {
  switch (reason) {
    case RevokeReason::lost_renewal:
      return "lost_renewal";
    case RevokeReason::connection_lost:
      return "connection_lost";
    case RevokeReason::evicted:
      return "evicted";
    case RevokeReason::stepped_down:
      return "stepped_down";
    case RevokeReason::shutting_down:
      return "shutting_down";
  }
  return "unknown";
}

}  // namespace baton
