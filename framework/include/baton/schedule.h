// Options of a periodic job (Node::every, Node::cron): what a tick enqueues, and what the leader
// does with ticks that came due while no node led. Plain values, safe to copy anywhere.
#pragma once

#include <string>

namespace baton {

// What the leader does with ticks that came due while no node led (or the cluster was down).
enum class MissedTicks {
  latest,  // run the latest missed tick once (default)
  all,     // run every missed tick, oldest first, up to ScheduleOptions::catch_up_limit
  skip,    // run none of them; wait for the next tick
};

struct ScheduleOptions {
  std::string type{};  // job type; default: the schedule's name
  std::string queue = "default";
  MissedTicks missed = MissedTicks::latest;
  int catch_up_limit = 10;  // with MissedTicks::all, the newest this many
  int max_attempts = 3;
};

}  // namespace baton
