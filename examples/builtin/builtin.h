// Handlers batond ships for demos, drills and benchmarks.
//   noop:  does nothing.
//   sleep: sleeps {"ms": N} milliseconds (N <= 3600000), waking early when cancelled.
//   fail:  always throws {"message": "..."}: for retry and dead-letter drills.
#pragma once

#include <baton/baton.h>

namespace builtin {

void register_handlers(baton::Node& node);

}  // namespace builtin
