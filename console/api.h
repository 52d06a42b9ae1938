// What the console's pages ask for, as JSON: one function per endpoint, on the caller's
// transaction (search path set to baton's schema), and the actions, each one transaction of
// baton::Admin. console.cpp routes, authenticates and caches; this file only reads and acts.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

namespace baton::console {

using Json = nlohmann::ordered_json;
using Params = std::map<std::string, std::string>;

// Thrown for a request the console refuses: `status` and a message for the page.
struct ApiError {
  int status;
  std::string message;
};

// The leaders, the nodes and the newest leadership events.
Json cluster(pqxx::transaction_base& tx);
// Per queue: depth by state, paused, dead letters, and the age of the oldest available job.
Json queues(pqxx::transaction_base& tx);
// Jobs wherever they are (live, history, dead) matching id, queue, type, state, partition key;
// newest first, at most 100.
Json jobs(pqxx::transaction_base& tx, const Params& p);
// One job and its story: enqueue, every attempt (node, epoch, error), its end.
Json job(pqxx::transaction_base& tx, const Params& p);
Json dead(pqxx::transaction_base& tx, const Params& p);
Json schedules(pqxx::transaction_base& tx);
// By id, or by a correlation property (type, property, value), or the newest of a type.
Json sagas(pqxx::transaction_base& tx, const Params& p);

// Per queue and minute over the last hour: completed, dead, wait and run medians. Kept between
// calls: each refresh reads the minutes since the last complete one and, until the hour is
// filled, one more 10-minute chunk of the past, so no read covers more than a few minutes of a
// busy history.
class Series {
 public:
  Json read(pqxx::transaction_base& tx);

 private:
  struct Minute {
    std::int64_t completed = 0;
    std::int64_t dead = 0;
    double wait_p50_ms = -1;
    double run_p50_ms = -1;
  };
  std::mutex mutex_;
  // minute (seconds since the epoch) -> queue -> figures
  std::map<std::int64_t, std::map<std::string, Minute>> minutes_;
  std::int64_t complete_until_ = 0;  // minutes before this one are read and stable
  std::int64_t filled_from_ = 0;     // minutes from this one on are read
};

// An action from the page, as {"action": ..., ...}; returns {"message": ...}. `actor` is who
// asked (recorded by the queue actions, logged by the caller).
Json act(pqxx::connection& conn, const std::string& schema, const std::string& actor,
         const Json& request);

}  // namespace baton::console
