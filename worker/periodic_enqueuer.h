// Periodic enqueuer: while leading, enqueues each due tick of each periodic schedule as an
// ordinary job. A tick is claimed by moving periodic_schedules.last_tick forward with a
// compare-and-set in the same transaction as the enqueue, so it is enqueued exactly once however
// many leaders come and go. Time comes from the database clock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "baton/detail/observer.h"
#include "baton/detail/schedule.h"
#include "baton/schedule.h"
#include "worker/periodic.h"

namespace baton::worker {

struct PeriodicJob {
  std::string name;
  std::shared_ptr<const detail::Schedule> schedule;
  nlohmann::json payload;
  ScheduleOptions options;  // options.type is filled
};

std::unique_ptr<PeriodicService> make_periodic_enqueuer(const detail::ConnectOptions& connect,
                                                        std::vector<PeriodicJob> jobs,
                                                        detail::ScheduleObserver* observer);

}  // namespace baton::worker
