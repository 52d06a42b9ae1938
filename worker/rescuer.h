// Rescuer: while leading, gives back to the queue the jobs that no live run will finish: running
// jobs of this lock group's older epochs (their leader is gone; at grant and every interval after),
// jobs of a lock group left without a leader, and jobs whose handler produced no outcome within
// its timeout plus a grace (a hung handler). A lost run that was a job's last attempt sends it to
// dead_jobs as `crashed`. Each pass also hands the executor the cancellations asked for jobs it
// runs, in case their NOTIFY was missed, and ends the transactions a deposed leader of this
// group still has open (a frozen process, a handler on a dead network).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "baton/detail/job_store.h"
#include "worker/periodic.h"

namespace baton::worker {

struct RescuerConfig {
  Millis interval{2000};
  Millis timeout_grace{5000};
  // Another lock group's running jobs are rescued once it has had no valid lease this long.
  Millis leaderless_grace{30000};
  // Transactions of this group's other nodes (deposed leaders) open longer than this are ended,
  // so that their row locks never hold up this leader (0: leave them).
  Millis deposed_after{0};
  // Shard 0 (of a deployment of this many shards) also moves waiting jobs whose shard no longer
  // exists to one that does (0: not this rescuer).
  int move_strays_shards = 0;
  // The group the nodes rows name (shard 0's); empty: this rescuer's lock group.
  std::string node_group{};
};

// What the rescuer asks of the node's executor.
struct RescuerHooks {
  std::function<std::vector<std::int64_t>()> running_ids;  // never rescued: this node runs them
  std::function<void(std::int64_t)> cancel_job;
};

std::unique_ptr<PeriodicService> make_rescuer(const detail::ConnectOptions& connect,
                                              const RescuerConfig& config,
                                              const detail::LockName& lock, std::string node_id,
                                              RescuerHooks hooks);

}  // namespace baton::worker
