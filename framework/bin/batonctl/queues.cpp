// batonctl queue pause | resume | list | ordered.
#include <iostream>

#include <baton/admin.h>

#include "baton/detail/inspect.h"
#include "common.h"
#include "output.h"

namespace batonctl {

void add_queues(CLI::App& app, const Global& g, Command& chosen) {
  struct Options {
    std::string name;
    int partitions = 0;
  };
  auto o = std::make_shared<Options>();
  auto* queue = app.add_subcommand("queue", "pause, resume or list queues");
  queue->require_subcommand(1);
  for (const bool pause : {true, false}) {
    auto* cmd = queue->add_subcommand(
        pause ? "pause" : "resume",
        pause ? "the leader stops claiming NAME's jobs" : "the leader claims NAME's jobs again");
    cmd->add_option("name", o->name, "queue")->required();
    cmd->callback([&g, &chosen, o, pause] {
      chosen = [&g, o, pause] {
        auto conn = open(g);
        const bool known = baton::Admin(*conn, g.schema, actor()).set_paused(o->name, pause);
        if (!known) {
          std::cerr << "batonctl: warning: queue " << o->name
                    << " has no jobs and no settings; check the name (the setting is kept)\n";
        }
        print_result(
            g.json,
            "queue " + o->name +
                (pause ? " paused: the leader claims none of its jobs until resumed" : " resumed"),
            {{"queue", o->name}, {"paused", pause}, {"known", known}});
        return 0;
      };
    });
  }
  queue->add_subcommand("list", "queues with jobs or settings, paused or not")
      ->callback([&g, &chosen] {
        chosen = [&g] {
          auto conn = open(g);
          pqxx::read_transaction tx(*conn);
          print_rows(baton::detail::inspect::queue_list(tx), g.json);
          return 0;
        };
      });
  auto* ordered = queue->add_subcommand(
      "ordered", "declare NAME ordered: jobs with one partition key run one at a time, in order");
  ordered->add_option("name", o->name, "queue")->required();
  ordered->add_option("--partitions", o->partitions, "partition count (1..4096)")->required();
  ordered->callback([&g, &chosen, o] {
    chosen = [&g, o] {
      auto conn = open(g);
      baton::Admin(*conn, g.schema, actor()).declare_ordered(o->name, o->partitions);
      print_result(g.json,
                   "queue " + o->name + " is ordered with " + std::to_string(o->partitions) +
                       " partitions: jobs with one partition_key run one at a time, in order",
                   {{"queue", o->name}, {"partitions", o->partitions}});
      return 0;
    };
  });
}

}  // namespace batonctl
