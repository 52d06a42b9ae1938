// What operators read about a deployment: per-queue figures, the leaders, the nodes, one job's
// story, dead letters, schedules and sagas. One query each, on the caller's transaction (search
// path set to baton's schema), shared by batonctl and the console.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

namespace baton::detail::inspect {

// A node is live while it touched its row this recently (nodes touch it every second).
constexpr int kLiveSeconds = 5;

// Per queue: available, scheduled, running, completed, dead, paused, jobs waiting for a handler,
// oldest available age, last-minute and last-15-minute throughput, wait and run percentiles.
pqxx::result queue_stats(pqxx::transaction_base& tx);
// Per lock row: leader, epoch, lease, the leader's host and metrics address.
pqxx::result leaders(pqxx::transaction_base& tx);
// Nodes seen in the last hour; role and status follow the lease and last_seen.
pqxx::result nodes(pqxx::transaction_base& tx);
// A job wherever it is: live, in history or dead (one row), with its error history.
pqxx::result job(pqxx::transaction_base& tx, std::int64_t id);
// Dead letters, newest first (of `queue` when not empty).
pqxx::result dead_list(pqxx::transaction_base& tx, const std::string& queue, int limit);
pqxx::result dead_show(pqxx::transaction_base& tx, std::int64_t id);
// Queues with jobs or settings, paused or not, ordered or not.
pqxx::result queue_list(pqxx::transaction_base& tx);
pqxx::result sagas(pqxx::transaction_base& tx, const std::string& type, bool with_completed,
                   int limit);
pqxx::result saga(pqxx::transaction_base& tx, const std::string& id);
// Schedules with their last and next tick and how the last run went (the next tick is computed
// here from the stored spec).
nlohmann::ordered_json schedules(pqxx::transaction_base& tx);

// Rows as a JSON array of objects, columns in order: numbers, booleans and JSON columns as
// themselves, the rest as strings, NULL as null.
nlohmann::ordered_json to_json(const pqxx::result& rows);

}  // namespace baton::detail::inspect
