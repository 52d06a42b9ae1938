// Depth sampler: while leading, counts each queue's jobs by state (available, scheduled,
// running) and the age of its oldest available job, every interval, for the metrics. Only the
// leader samples, so the cluster reports each queue once.
#pragma once

#include <memory>

#include "baton/detail/observer.h"
#include "worker/periodic.h"

namespace baton::worker {

// The statement one sample runs (for benchmarks).
const char* depth_sql();

std::unique_ptr<PeriodicService> make_depth_sampler(const detail::ConnectOptions& connect,
                                                    Millis interval,
                                                    detail::QueueObserver* observer);

}  // namespace baton::worker
