// Handlers batond ships for demos, drills and benchmarks.
//   noop:  does nothing.
//   sleep: sleeps {"ms": N} milliseconds (N <= 3600000), waking early when cancelled.
//   fail:  always throws {"message": "..."}: for retry and dead-letter drills.
//   record_tx: transactional; inserts one row (job_id, node, epoch) into table `effects` of the
//          node's schema, then sleeps {"ms": N} inside the transaction. Drills and tests count
//          the rows to prove a deposed leader never commits twice. The table is the operator's:
//          CREATE TABLE effects (job_id bigint, node text, epoch bigint).
//   record_ext: an effect outside the job's transaction (at least once): inserts a row into
//          table `executions` on a connection of its own, then fails if the attempt is at most
//          {"fail_attempts": N}, then sleeps {"ms": N}. The table is the operator's:
//          CREATE TABLE executions (job_id bigint, node text, epoch bigint, attempt int,
//                                   at timestamptz DEFAULT clock_timestamp()).
//   record_run: sleeps {"ms": N} (waking early when cancelled, or once the file named by
//          {"until_exists": PATH} exists) and appends a line to `run_log`
//          as it starts and one as it ends, with the time in microseconds since the epoch:
//            start <job id> <attempt> <epoch> <node> <us> <started_at us> <idempotency key>
//            end <job id> <attempt> <epoch> <node> <us> <ok|cancelled>
//          (<started_at us> is JobContext::started_at(), read before the node's lease check).
//          Tests read it to prove that no two runs of one job overlap. Refused (discarded) when
//          the node was started without a run log.
#pragma once

#include <string>

#include <baton/baton.h>

namespace builtin {

// `run_log`: the file record_run appends to ("" : record_run refuses its jobs).
void register_handlers(baton::Node& node, const std::string& run_log = "");

}  // namespace builtin
