// A job's status and its cancellation through the SQL API (baton.job_status, baton.cancel), on
// the caller's transaction: shared by the Client, Admin, batonctl and the console.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <pqxx/pqxx>

#include "baton/job.h"

namespace baton::detail {

CancelResult cancel_job(pqxx::transaction_base& tx, const std::string& schema, std::int64_t id);
std::optional<std::int64_t> job_id_by_key(pqxx::transaction_base& tx, const std::string& schema,
                                          std::string_view queue, std::string_view key);
std::optional<JobStatus> job_status(pqxx::transaction_base& tx, const std::string& schema,
                                    std::int64_t id);

}  // namespace baton::detail
