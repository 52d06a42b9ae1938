// Control messages between operators and nodes, defined once.
//
// A request to a leader (step down) is a row of control_requests: only a role that may INSERT
// there (an operator's) can make one, and the row records who did (the session's user). The
// NOTIFY on the leader channel that follows only wakes the nodes: anyone can send a NOTIFY, so
// its payload is never trusted as a request. The other payload on that channel, "released <node>",
// tells followers that a leader gave its lock up; a forged one only makes them look sooner.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

namespace baton::detail {

enum class ControlKind { step_down };

struct ControlRequest {
  ControlKind kind = ControlKind::step_down;
  std::string target = "*";  // a node id, or "*" for whichever node leads
  std::string lock_group;    // "<region>/<lock_key>"; empty: every group
  std::string note;          // shown in the node's log, e.g. "batonctl drill"
};

// Records the request (in `tx`, on `schema`) and wakes the nodes at commit. Returns its id.
std::int64_t send_control(pqxx::transaction_base& tx, const std::string& schema,
                          const ControlRequest& request);

// A request a leader took: accepted (it steps down now) or not, and why.
struct TakenRequest {
  std::int64_t id = 0;
  std::string requested_by;  // the database role that asked
  std::string note;
  bool accepted = false;
  std::string outcome;  // "accepted", "expired (...)", "refused: ..."
};

// The leader's side: takes the pending step-down requests addressed to `node_id` (or to any
// leader) of `lock_group`, marks them handled with their outcome, and returns them. At most one is
// accepted, and none while `accept_after` is in the future (the rate limit); requests older than
// `max_age` expire. Runs on the caller's connection, search_path set to baton's schema.
std::vector<TakenRequest> take_control(pqxx::connection& conn, const std::string& node_id,
                                       const std::string& lock_group, bool may_accept,
                                       std::chrono::seconds max_age);

// What a NOTIFY on the leader channel carries.
struct LeaderSignal {
  enum Kind { released, control } kind = control;
  std::string node;  // for released: the node that gave the lock up

  std::string encode() const;
  // Unknown payloads are nullopt (ignored).
  static std::optional<LeaderSignal> parse(const std::string& payload);
};

}  // namespace baton::detail
