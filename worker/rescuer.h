// Rescuer: while leading, gives jobs back to the queue that no live run will finish: running jobs
// of older epochs (their leader is gone; at grant and every interval after), and jobs whose
// handler produced no outcome within its timeout plus a grace (a hung handler).
#pragma once

#include <memory>

#include "worker/periodic.h"

namespace baton::worker {

struct RescuerConfig {
  Millis interval{2000};
  Millis timeout_grace{5000};
};

std::unique_ptr<PeriodicService> make_rescuer(const detail::ConnectOptions& connect,
                                              RescuerConfig config);

}  // namespace baton::worker
