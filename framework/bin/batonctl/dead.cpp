// batonctl dead list | show | retry | discard | purge: the dead letters.
#include <baton/admin.h>
#include <baton/config.h>

#include "baton/detail/inspect.h"
#include "common.h"
#include "output.h"

namespace batonctl {

void add_dead(CLI::App& app, const Global& g, Command& chosen) {
  struct Options {
    std::string queue;
    int limit = 50;
    std::int64_t id = 0;
    bool all = false;
    std::string older_than;
  };
  auto o = std::make_shared<Options>();
  auto* dead = app.add_subcommand("dead", "dead-lettered jobs");
  dead->require_subcommand(1);

  auto* list = dead->add_subcommand("list", "list dead jobs, newest first");
  list->add_option("--queue", o->queue, "only this queue");
  list->add_option("--limit", o->limit, "most rows")->capture_default_str();
  list->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      pqxx::read_transaction tx(*conn);
      print_rows(baton::detail::inspect::dead_list(tx, o->queue, checked_limit(o->limit)), g.json);
      return 0;
    };
  });

  auto* show = dead->add_subcommand("show", "one dead job with its payload and every error");
  show->add_option("id", o->id, "job id")->required();
  show->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      pqxx::read_transaction tx(*conn);
      const auto rows = baton::detail::inspect::dead_show(tx, o->id);
      if (rows.empty()) throw Failure("no dead job " + std::to_string(o->id));
      print_record(rows, g.json);
      return 0;
    };
  });

  auto* retry = dead->add_subcommand("retry", "put dead jobs back in the queue (same id)");
  retry->add_option("id", o->id, "job id");
  retry->add_flag("--all", o->all, "every dead job (of --queue)");
  retry->add_option("--queue", o->queue, "only this queue (with --all)");
  retry->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      if ((o->id == 0) == !o->all)
        throw UsageError("dead retry takes a job id or --all (not both)");
      auto conn = open(g);
      baton::Admin admin(*conn, g.schema, actor());
      std::int64_t n = 0;
      if (o->all) {
        n = admin.retry_dead_all(o->queue);
      } else if (admin.retry_dead(o->id)) {
        n = 1;
      } else {
        throw Failure("no dead job " + std::to_string(o->id) +
                      " (or a live job holds its idempotency key)");
      }
      print_result(g.json, "requeued " + std::to_string(n) + " dead job(s) with fresh attempts",
                   {{"requeued", n}});
      return 0;
    };
  });

  auto* discard = dead->add_subcommand("discard", "delete one dead job for good");
  discard->add_option("id", o->id, "job id")->required();
  discard->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      if (!baton::Admin(*conn, g.schema, actor()).discard_dead(o->id)) {
        throw Failure("no dead job " + std::to_string(o->id));
      }
      print_result(g.json, "discarded dead job " + std::to_string(o->id), {{"discarded", o->id}});
      return 0;
    };
  });

  auto* purge = dead->add_subcommand("purge", "delete dead jobs older than a duration");
  purge->add_option("--older-than", o->older_than, "e.g. 720h (30 days), 168h (7 days)")
      ->required();
  purge->add_option("--queue", o->queue, "only this queue");
  purge->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      const auto age = baton::parse_duration(o->older_than, "older-than");
      auto conn = open(g);
      const auto n = baton::Admin(*conn, g.schema, actor()).purge_dead(age, o->queue);
      print_result(g.json,
                   "purged " + std::to_string(n) + " dead job(s) older than " + o->older_than,
                   {{"purged", n}});
      return 0;
    };
  });
}

}  // namespace batonctl
