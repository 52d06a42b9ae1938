// batonctl enqueue: one job, copies of one job, or JSON lines from a file or stdin.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include <baton/client.h>
#include <baton/config.h>
#include <nlohmann/json.hpp>

#include "baton/detail/db.h"
#include "common.h"
#include "output.h"

namespace batonctl {
namespace {

struct EnqueueOptions {
  std::string type;
  std::string payload = "{}";
  std::string queue = "default";
  int count = 1;
  int priority = 0;
  std::string delay = "0ms";
  int max_attempts = 10;
  std::string file;
};

// Why one job object is refused, asked of the database (the SQL API's own validation).
std::string problem_of(pqxx::connection& conn, const std::string& schema,
                       const nlohmann::json& job) {
  try {
    pqxx::nontransaction tx(conn);
    tx.exec_params(baton::detail::with_schema("SELECT @.validate_jobs($1::jsonb)", schema),
                   nlohmann::json::array({job}).dump());
    return "";
  } catch (const pqxx::sql_error& e) {
    return baton::detail::server_message(e);
  }
}

// Enqueues JSON lines in batches of 1,000, with a progress line when stderr is a terminal. Each
// line is a job object of the SQL API, or (with --type) a payload. A batch the database refuses
// is checked line by line to say which line is wrong; the batches before it stay enqueued.
int enqueue_lines(const Global& g, const EnqueueOptions& o) {
  std::ifstream file;
  if (o.file != "-") {
    file.open(o.file);
    if (!file) throw UsageError("--file: cannot read " + o.file);
  }
  std::istream& in = o.file == "-" ? std::cin : file;
  auto conn = open(g);
  baton::Client client(g.database_url, g.schema);
  const bool tty = isatty(2) != 0;
  auto batch = nlohmann::json::array();
  std::vector<long long> batch_lines;
  long long total = 0, line_no = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    try {
      total += static_cast<long long>(client.enqueue_objects(batch).size());
    } catch (const baton::EnqueueError& e) {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto why = problem_of(*conn, g.schema, batch[i]);
        if (!why.empty()) {
          throw UsageError("line " + std::to_string(batch_lines[i]) + ": " + why + " (" +
                           std::to_string(total) + " job(s) of earlier lines were enqueued)");
        }
      }
      throw UsageError(std::string(e.what()) + " (" + std::to_string(total) +
                       " job(s) of earlier lines were enqueued)");
    }
    batch.clear();
    batch_lines.clear();
    if (tty) std::fprintf(stderr, "\renqueued %lld jobs", total);
  };
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      throw UsageError("line " + std::to_string(line_no) + " is not JSON: " + line.substr(0, 80));
    }
    nlohmann::json job;
    if (!o.type.empty()) {
      job = {{"type", o.type}, {"queue", o.queue}, {"payload", j}};
    } else {
      if (!j.is_object() || !j.contains("type")) {
        throw UsageError("line " + std::to_string(line_no) +
                         " has no \"type\"; give each line a type or pass --type");
      }
      job = std::move(j);
      if (!job.contains("queue")) job["queue"] = o.queue;
    }
    batch.push_back(std::move(job));
    batch_lines.push_back(line_no);
    if (batch.size() == 1000) flush();
  }
  flush();
  if (tty) std::fprintf(stderr, "\n");
  print_result(
      g.json,
      "enqueued " + std::to_string(total) + " job(s) from " + std::to_string(line_no) + " line(s)",
      {{"enqueued", total}, {"lines", line_no}});
  return 0;
}

int enqueue_one(const Global& g, const EnqueueOptions& o) {
  if (o.type.empty()) throw UsageError("enqueue needs --type (or --file)");
  baton::EnqueueOptions opts;
  opts.queue = o.queue;
  opts.priority = o.priority;
  opts.max_attempts = o.max_attempts;
  opts.delay = baton::parse_duration(o.delay, "delay");
  const auto body = nlohmann::json::parse(o.payload, nullptr, false);
  if (body.is_discarded()) throw UsageError("--payload is not valid JSON: " + o.payload);
  open(g, false);  // the same clear errors as the other commands
  baton::Client client(g.database_url, g.schema);
  auto ids = o.count == 1 ? std::vector<std::int64_t>{client.enqueue(o.type, body, opts)}
                          : client.enqueue_copies(o.type, body, o.count, opts);
  print_result(g.json,
               "enqueued " + std::to_string(ids.size()) + " job(s) of type " + o.type +
                   " in queue " + o.queue + " (ids " + std::to_string(ids.front()) + ".." +
                   std::to_string(ids.back()) + ")",
               {{"enqueued", ids.size()}, {"first_id", ids.front()}, {"last_id", ids.back()}});
  return 0;
}

}  // namespace

void add_enqueue(CLI::App& app, const Global& g, Command& chosen) {
  auto o = std::make_shared<EnqueueOptions>();
  auto* cmd = app.add_subcommand("enqueue", "enqueue jobs");
  cmd->add_option("--type", o->type, "job type (with --file: the type of every line)");
  cmd->add_option("--file", o->file,
                  "JSON lines to enqueue, - for stdin: each line a job object of the SQL API "
                  "(type, payload, queue, priority, delay_ms, max_attempts, ...) or, with --type, "
                  "a payload");
  cmd->add_option("--payload", o->payload, "JSON payload")->capture_default_str();
  cmd->add_option("--queue", o->queue, "queue")->capture_default_str();
  cmd->add_option("--count", o->count, "how many copies")->capture_default_str();
  cmd->add_option("--priority", o->priority, "lower runs first")->capture_default_str();
  cmd->add_option("--delay", o->delay, "run after this long (e.g. 30s)")->capture_default_str();
  cmd->add_option("--max-attempts", o->max_attempts, "attempts before dead-lettering")
      ->capture_default_str();
  cmd->callback([&g, &chosen, o] {
    chosen = [&g, o] { return o->file.empty() ? enqueue_one(g, *o) : enqueue_lines(g, *o); };
  });
}

}  // namespace batonctl
