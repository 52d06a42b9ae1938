// Periodic enqueuer (see periodic_enqueuer.h).
#include "worker/periodic_enqueuer.h"

#include <date/date.h>
#include <spdlog/spdlog.h>

#include <map>

namespace baton::worker {
namespace {

constexpr const char* kDeclareSql = R"sql(
INSERT INTO periodic_schedules (name, spec, type, queue, missed)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE
   SET spec = excluded.spec, type = excluded.type, queue = excluded.queue,
       missed = excluded.missed, active = true, updated_at = now()
RETURNING extract(epoch FROM last_tick)::bigint
)sql";

// Schedules the leader no longer declares stop firing; their rows stay.
constexpr const char* kRetireSql = R"sql(
UPDATE periodic_schedules SET active = false, updated_at = now()
 WHERE active AND NOT (name = ANY ($1::text[]))
)sql";

// Moves last_tick forward if nobody handled this tick yet; returns 1 row when this call owns it.
constexpr const char* kClaimTickSql = R"sql(
UPDATE periodic_schedules
   SET last_tick = to_timestamp($2), updated_at = now()
 WHERE name = $1 AND (last_tick IS NULL OR last_tick < to_timestamp($2))
RETURNING name
)sql";

constexpr const char* kEnqueueSql = "SELECT * FROM enqueue_many($1::jsonb)";

constexpr const char* kRecordJobSql = R"sql(
UPDATE periodic_schedules SET last_job_id = $2, last_enqueued_at = now() WHERE name = $1
)sql";

const char* missed_name(MissedTicks m) {
  switch (m) {
    case MissedTicks::latest:
      return "latest";
    case MissedTicks::all:
      return "all";
    case MissedTicks::skip:
      return "skip";
  }
  return "latest";
}

struct State {
  std::int64_t epoch = 0;  // the epoch the rows were declared under
  std::map<std::string, detail::SysSeconds> last;
};

detail::SysSeconds seconds_of(std::int64_t s) {
  return detail::SysSeconds(std::chrono::seconds(s));
}

void declare(pqxx::connection& conn, const std::vector<PeriodicJob>& jobs, State& state,
             detail::SysSeconds now) {
  pqxx::work tx(conn);
  std::string names = "{";
  for (const auto& j : jobs) {
    auto r = tx.exec_params(kDeclareSql, j.name, j.schedule->describe(), j.options.type,
                            j.options.queue, std::string(missed_name(j.options.missed)));
    if (r[0][0].is_null()) {
      // A new schedule starts with its next tick: it does not backfill the past.
      tx.exec_params(kClaimTickSql, j.name, now.time_since_epoch().count());
      state.last[j.name] = now;
    } else {
      state.last[j.name] = seconds_of(r[0][0].as<std::int64_t>());
    }
    names += (names.size() > 1 ? ",\"" : "\"") + j.name + "\"";
  }
  tx.exec_params(kRetireSql, names + "}");
  tx.commit();
}

}  // namespace

std::unique_ptr<PeriodicService> make_periodic_enqueuer(const detail::ConnectOptions& connect,
                                                        std::vector<PeriodicJob> jobs,
                                                        detail::ScheduleObserver* observer) {
  auto state = std::make_shared<State>();
  return std::make_unique<PeriodicService>(
      "periodic_enqueuer", connect, Millis(200),
      [jobs = std::move(jobs), state, observer](pqxx::connection& conn, std::int64_t epoch) {
        const auto now = seconds_of([&] {
          pqxx::nontransaction tx(conn);
          return tx.exec("SELECT floor(extract(epoch FROM now()))::bigint")[0][0]
              .as<std::int64_t>();
        }());
        if (state->epoch != epoch) {
          declare(conn, jobs, *state, now);
          state->epoch = epoch;
        }
        for (const auto& j : jobs) {
          auto& last = state->last[j.name];
          std::vector<detail::SysSeconds> due;
          for (auto t = j.schedule->next_after(last); t <= now; t = j.schedule->next_after(t)) {
            due.push_back(t);
            if (due.size() > 100'000) due.erase(due.begin(), due.begin() + 50'000);
          }
          if (due.empty()) continue;
          std::vector<detail::SysSeconds> run;
          if (j.options.missed == MissedTicks::all) {
            const auto keep = std::min<std::size_t>(
                due.size(), static_cast<std::size_t>(std::max(1, j.options.catch_up_limit)));
            run.assign(due.end() - static_cast<std::ptrdiff_t>(keep), due.end());
          } else if (j.options.missed == MissedTicks::latest || due.size() == 1) {
            // With `skip`, a single due tick is the current one (it fell due since the last look).
            run.push_back(due.back());
          }
          for (const auto tick : run) {
            pqxx::work tx(conn);
            if (tx.exec_params(kClaimTickSql, j.name, tick.time_since_epoch().count()).empty()) {
              continue;  // another leader (or an earlier pass) handled it
            }
            nlohmann::json job{
                {"type", j.options.type},
                {"queue", j.options.queue},
                {"payload", j.payload},
                {"max_attempts", j.options.max_attempts},
                // The job is scheduled for its tick: history keeps which tick it was, and its
                // wait time is the enqueue lag plus the queue's.
                {"run_at", date::format("%FT%TZ", tick)},
                {"idempotency_key", "periodic:" + j.name + ":" + date::format("%FT%TZ", tick)}};
            const auto ids = tx.exec_params(kEnqueueSql, nlohmann::json::array({job}).dump());
            if (!ids.empty()) tx.exec_params(kRecordJobSql, j.name, ids[0][0].as<std::int64_t>());
            tx.commit();
            const double lag = static_cast<double>((now - tick).count());
            spdlog::info("periodic tick enqueued: schedule={} tick={} lag={}s", j.name,
                         date::format("%FT%TZ", tick), lag);
            if (observer != nullptr) observer->tick_enqueued(j.name, lag);
          }
          // Ticks not run (skip, or beyond the catch-up limit) are marked handled.
          {
            pqxx::work tx(conn);
            tx.exec_params(kClaimTickSql, j.name, due.back().time_since_epoch().count());
            tx.commit();
          }
          last = due.back();
        }
      });
}

}  // namespace baton::worker
