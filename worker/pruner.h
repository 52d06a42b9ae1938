// Pruner: while leading, deletes job_history rows older than the retention, in small batches.
#pragma once

#include <memory>

#include "worker/periodic.h"

namespace baton::worker {

struct PrunerConfig {
  Millis retention{7LL * 24 * 3600 * 1000};
  Millis interval{60'000};
  int batch = 1000;
};

std::unique_ptr<PeriodicService> make_pruner(const detail::ConnectOptions& connect,
                                             PrunerConfig config);

}  // namespace baton::worker
