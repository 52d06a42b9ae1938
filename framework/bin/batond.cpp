// batond: a baton node with the built-in handlers (noop, sleep, fail) and the examples' handlers
// (send_email). Users normally build their own node; this one serves demos, drills and benches.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <baton/baton.h>

#include "builtin/builtin.h"
#include "email_sender/email.h"

namespace {

std::string env_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  baton::NodeConfig c;
  CLI::App app{"batond: a node of a baton cluster. Every node runs the same binary; one leads."};
  app.option_defaults()->always_capture_default();
  c.database_url = env_or("DATABASE_URL", "");
  std::string queues, log_level = "info", outbox;
  std::string poll = "1s", ttl = "2s", renew = "200ms", retry = "100ms", grace = "10s",
              retry_base = "1s", retry_cap = "1h";
  bool no_migrate = false;
  app.add_option("--database-url", c.database_url,
                 "libpq connection string (URI or key=value); default: $DATABASE_URL");
  app.add_option("--schema", c.schema, "schema holding baton's tables");
  app.add_option("--node-id", c.node_id, "this node's name (default host:pid)");
  app.add_option("--threads", c.threads, "handler threads");
  app.add_option("--queues", queues, "comma-separated queues to consume (default: all)");
  app.add_option("--metrics-listen", c.metrics_listen,
                 "host:port for /metrics (port 0: any free port), or off");
  app.add_flag("--no-migrate", no_migrate, "do not apply migrations at start (require current)");
  app.add_option("--batch-size", c.batch_size, "most jobs one claim takes");
  app.add_option("--poll-interval", poll, "poll when no NOTIFY arrives (e.g. 1s)");
  app.add_option("--lock-key", c.lock_key, "lock row key");
  app.add_option("--region", c.region, "lock row region");
  app.add_option("--lock-ttl", ttl, "leadership lease length");
  app.add_option("--renew-interval", renew, "lease renewal interval (at most lock-ttl / 3)");
  app.add_option("--retry-interval", retry, "how often a follower tries to lead");
  app.add_option("--shutdown-grace", grace, "how long SIGTERM waits for running jobs");
  app.add_option("--retry-base", retry_base, "first retry delay of a failed job");
  app.add_option("--retry-cap", retry_cap, "longest retry delay");
  app.add_option("--outbox", outbox, "directory where send_email writes messages (default: log)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  CLI11_PARSE(app, argc, argv);

  try {
    c.migrate = !no_migrate;
    c.poll_interval = baton::parse_duration(poll, "poll-interval");
    c.lock_ttl = baton::parse_duration(ttl, "lock-ttl");
    c.renew_interval = baton::parse_duration(renew, "renew-interval");
    c.retry_interval = baton::parse_duration(retry, "retry-interval");
    c.shutdown_grace = baton::parse_duration(grace, "shutdown-grace");
    c.retry_base = baton::parse_duration(retry_base, "retry-base");
    c.retry_cap = baton::parse_duration(retry_cap, "retry-cap");
    std::stringstream list(queues);
    for (std::string q; std::getline(list, q, ',');) {
      if (!q.empty()) c.queues.push_back(q);
    }
    baton::Node node(c);  // validates; fills node_id
    spdlog::set_default_logger(spdlog::stderr_color_mt("batond"));
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [" + node.config().node_id + "] %v");
    spdlog::set_level(spdlog::level::from_str(log_level));
    builtin::register_handlers(node);
    email::register_handlers(node, outbox);
    node.run();
  } catch (const baton::ConfigError& e) {
    std::cerr << "batond: bad setting: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "batond: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
