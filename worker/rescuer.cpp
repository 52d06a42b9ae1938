// Rescuer (see rescuer.h).
#include "worker/rescuer.h"

#include <spdlog/spdlog.h>

#include "baton/detail/job_store.h"

namespace baton::worker {

std::unique_ptr<PeriodicService> make_rescuer(const detail::ConnectOptions& connect,
                                              RescuerConfig config) {
  return std::make_unique<PeriodicService>(
      "rescuer", connect, config.interval,
      [grace = config.timeout_grace](pqxx::connection& conn, std::int64_t epoch) {
        if (const auto n = detail::rescue_older_epochs(conn, epoch); n > 0) {
          spdlog::warn("rescued {} running jobs of older epochs (epoch={})", n, epoch);
        }
        if (const auto n = detail::rescue_timed_out(conn, grace.count()); n > 0) {
          spdlog::warn("rescued {} jobs that produced no outcome within their timeout", n);
        }
      });
}

}  // namespace baton::worker
