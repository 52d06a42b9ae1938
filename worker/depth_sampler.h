// Depth sampler: while leading, counts each queue's jobs by state (available, scheduled,
// running) and the age of its oldest available job, every interval, for the metrics; and the due
// jobs of types this node has no handler for, which wait for a leader that has one (a rolling
// deploy in progress, or a type nobody handles). Only the leader samples, so the cluster reports
// each queue once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "baton/detail/observer.h"
#include "worker/periodic.h"

namespace baton::worker {

// The statement one sample runs (for benchmarks).
const char* depth_sql();

struct DepthSamplerConfig {
  Millis interval{5000};
  std::vector<std::string> queues;  // the queues this node consumes; empty: all
  std::vector<std::string> types;   // the job types this node handles
};

std::unique_ptr<PeriodicService> make_depth_sampler(const detail::ConnectOptions& connect,
                                                    DepthSamplerConfig config,
                                                    detail::QueueObserver* observer);

}  // namespace baton::worker
