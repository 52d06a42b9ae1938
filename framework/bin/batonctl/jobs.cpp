// batonctl jobs show | cancel: one job's whole story, and cancelling it.
#include <baton/admin.h>

#include "baton/detail/inspect.h"
#include "baton/detail/job_queries.h"
#include "common.h"
#include "output.h"

namespace batonctl {
namespace {

struct JobOptions {
  std::int64_t id = 0;
  std::string queue = "default";
  std::string key;  // an idempotency key instead of an id
};

// The job the options name (by id, or by queue and idempotency key).
std::int64_t job_id(pqxx::connection& conn, const Global& g, const JobOptions& o) {
  if ((o.id != 0) == !o.key.empty()) throw UsageError("give a job id or --key (not both)");
  if (o.id != 0) return o.id;
  pqxx::read_transaction tx(conn);
  const auto id = baton::detail::job_id_by_key(tx, g.schema, o.queue, o.key);
  if (!id) throw Failure("no job with idempotency key '" + o.key + "' in queue " + o.queue);
  return *id;
}

}  // namespace

void add_jobs(CLI::App& app, const Global& g, Command& chosen) {
  auto o = std::make_shared<JobOptions>();
  auto* jobs = app.add_subcommand("jobs", "one job: its story, or cancel it");
  jobs->require_subcommand(1);
  for (auto* cmd : {jobs->add_subcommand("show", "a job wherever it is: queue, history or dead"),
                    jobs->add_subcommand("cancel",
                                         "cancel a job: not started, it never runs; "
                                         "running, its handler is told to stop")}) {
    cmd->add_option("id", o->id, "job id");
    cmd->add_option("--key", o->key, "the producer's idempotency key instead of an id");
    cmd->add_option("--queue", o->queue, "the queue of --key")->capture_default_str();
  }
  jobs->get_subcommand("show")->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      const auto id = job_id(*conn, g, *o);
      pqxx::read_transaction tx(*conn);
      const auto rows = baton::detail::inspect::job(tx, id);
      if (rows.empty()) {
        throw Failure("no job " + std::to_string(id) + " in the queue, history or dead jobs");
      }
      print_record(rows, g.json);
      return 0;
    };
  });
  jobs->get_subcommand("cancel")->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      const auto id = job_id(*conn, g, *o);
      const auto result = baton::Admin(*conn, g.schema, actor()).cancel(id);
      const std::string name(baton::to_string(result));
      const std::string text =
          result == baton::CancelResult::cancelled    ? "cancelled: it will not run"
          : result == baton::CancelResult::cancelling ? "cancelling: it is running; its handler "
                                                        "is told to stop"
          : result == baton::CancelResult::finished   ? "it had finished already; nothing changed"
                                                      : "no such job";
      print_result(g.json, "job " + std::to_string(id) + " " + text,
                   {{"id", id}, {"result", name}});
      return result == baton::CancelResult::not_found ? 1 : 0;
    };
  });
}

}  // namespace batonctl
