// batonctl stats | leader | nodes | schedules | sagas: what a deployment looks like now.
#include <iostream>

#include <baton/admin.h>

#include "baton/detail/inspect.h"
#include "common.h"
#include "output.h"

namespace batonctl {
namespace inspect = baton::detail::inspect;

void add_inspect(CLI::App& app, const Global& g, Command& chosen) {
  app.add_subcommand("stats", "per queue: available, scheduled, running, completed, dead, paused")
      ->callback([&g, &chosen] {
        chosen = [&g] {
          auto conn = open(g);
          pqxx::read_transaction tx(*conn);
          print_rows(inspect::queue_stats(tx), g.json);
          return 0;
        };
      });

  auto step_down = std::make_shared<bool>(false);
  auto* leader = app.add_subcommand("leader", "the current leader, its epoch and lease");
  leader->add_flag("--step-down", *step_down,
                   "ask the leader to drain and step down (a follower takes over)");
  leader->callback([&g, &chosen, step_down] {
    chosen = [&g, step_down] {
      auto conn = open(g);
      pqxx::result rows;
      {
        pqxx::read_transaction tx(*conn);
        rows = inspect::leaders(tx);
      }
      if (!*step_down) {
        if (rows.empty() && !g.json) {
          std::cout << "no node has led yet\n";
        } else {
          print_rows(rows, g.json);
        }
        return 0;
      }
      std::string who, epoch;
      for (const auto& r : rows) {
        if (std::string_view(r["lease_valid"].c_str()) == "t") {
          who = r["leader"].c_str();
          epoch = r["epoch"].c_str();
        }
      }
      if (who.empty()) throw Failure("no node leads now; nothing to step down");
      const auto id = baton::Admin(*conn, g.schema, actor()).request_step_down(who, actor());
      print_result(g.json,
                   "asked " + who + " (epoch " + epoch + ") to step down (request " +
                       std::to_string(id) + ")",
                   {{"leader", who}, {"request", id}});
      return 0;
    };
  });

  auto shards_to = std::make_shared<int>(0);
  auto* shards = app.add_subcommand(
      "shards", "the deployment's shard count, or set it (every node stopped) with --set N");
  shards->add_option("--set", *shards_to,
                     "the new count, 1..64; refused while a node of another count runs");
  shards->callback([&g, &chosen, shards_to] {
    chosen = [&g, shards_to] {
      auto conn = open(g);
      if (*shards_to == 0) {
        pqxx::read_transaction tx(*conn);
        const auto n = tx.exec(
                             "SELECT coalesce((SELECT value::int FROM settings WHERE key = "
                             "'shards'), 1)")[0][0]
                           .as<int>();
        print_result(g.json, std::to_string(n) + " shard(s)", {{"shards", n}});
        return 0;
      }
      pqxx::work tx(*conn);
      const auto moved =
          tx.exec_params("SELECT set_shards($1)", *shards_to)[0][0].as<std::int64_t>();
      tx.commit();
      print_result(g.json,
                   "the deployment has " + std::to_string(*shards_to) + " shard(s) now; " +
                       std::to_string(moved) +
                       " waiting job(s) moved; start every node with --shards " +
                       std::to_string(*shards_to),
                   {{"shards", *shards_to}, {"moved", moved}});
      return 0;
    };
  });

  app.add_subcommand("nodes", "nodes seen in the last hour: role, live or dead")
      ->callback([&g, &chosen] {
        chosen = [&g] {
          auto conn = open(g);
          pqxx::read_transaction tx(*conn);
          print_rows(inspect::nodes(tx), g.json);
          return 0;
        };
      });

  app.add_subcommand("schedules",
                     "periodic schedules: last and next tick, and how the last run went")
      ->callback([&g, &chosen] {
        chosen = [&g] {
          auto conn = open(g);
          pqxx::read_transaction tx(*conn);
          const auto rows = inspect::schedules(tx);
          if (rows.empty() && !g.json) {
            std::cout << "(no schedules)\n";
          } else {
            print_rows(rows, g.json);
          }
          return 0;
        };
      });

  struct SagaOptions {
    std::string type, id;
    bool with_completed = false;
    int limit = 50;
  };
  auto o = std::make_shared<SagaOptions>();
  auto* sagas = app.add_subcommand("sagas", "saga state");
  sagas->require_subcommand(1);
  auto* list = sagas->add_subcommand("list", "sagas, newest first, with their index values");
  list->add_option("--type", o->type, "only this saga type");
  list->add_flag("--completed", o->with_completed, "include completed sagas");
  list->add_option("--limit", o->limit, "most rows")->capture_default_str();
  list->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      pqxx::read_transaction tx(*conn);
      print_rows(inspect::sagas(tx, o->type, o->with_completed, checked_limit(o->limit)), g.json);
      return 0;
    };
  });
  auto* show = sagas->add_subcommand("show", "one saga with its data pretty-printed");
  show->add_option("id", o->id, "saga id (uuid)")->required();
  show->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      pqxx::read_transaction tx(*conn);
      const auto rows = inspect::saga(tx, o->id);
      if (rows.empty()) throw Failure("no saga " + o->id);
      print_record(rows, g.json);
      return 0;
    };
  });
}

}  // namespace batonctl
