// Node: one member of a baton cluster. It stands for election, and while it leads, claims jobs and
// runs their handlers on its thread pool; it always serves /metrics. Register handlers, then run().
// handle() must be called before run(); stop(), is_leader() and epoch() are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "baton/config.h"
#include "baton/events.h"
#include "baton/handler.h"
#include "baton/saga.h"
#include "baton/schedule.h"

namespace baton {

class Node {
 public:
  // Validates the config (throws ConfigError); connects nothing yet.
  explicit Node(NodeConfig config);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Registers the handler of a job type. Registering a type twice throws std::logic_error.
  void handle(const std::string& type, Handler handler, const HandlerOptions& options = {});

  // Registers a transactional handler (see TxHandler): exactly-once for its database writes.
  void handle_tx(const std::string& type, TxHandler handler, const HandlerOptions& options = {});

  // Typed form: the payload is mapped to T with nlohmann-json's from_json; a payload that does not
  // map sends the job to dead_jobs at once with the parse error.
  template <class T, class F>
  void handle(const std::string& type, F fn, const HandlerOptions& options = {}) {
    handle(
        type,
        [fn = std::move(fn)](JobContext& ctx) {
          T value;
          try {
            value = nlohmann::json::parse(ctx.job().payload).get<T>();
          } catch (const nlohmann::json::exception& e) {
            throw PayloadError(std::string("payload does not map to the handler's type: ") +
                               e.what());
          }
          fn(ctx, value);
        },
        options);
  }

  // Periodic jobs: the leader enqueues a job of type options.type (default: `name`) with
  // `payload` at every tick, exactly once per tick across the cluster (the tick is claimed in the
  // database with the enqueue). A schedule no longer declared by the leader stops firing; its
  // row and its jobs' history remain. Call before run(). Throws ConfigError for a bad interval,
  // expression or time zone, std::logic_error for a name used twice.
  void every(std::chrono::milliseconds interval, const std::string& name,
             nlohmann::json payload = nlohmann::json::object(), ScheduleOptions options = {});
  void every(std::string_view interval, const std::string& name,
             nlohmann::json payload = nlohmann::json::object(), ScheduleOptions options = {});
  void cron(const std::string& expression, const std::string& name,
            nlohmann::json payload = nlohmann::json::object(), const std::string& tz = "UTC",
            ScheduleOptions options = {});

  // Extra leadership callbacks (run after the node's own consumption starts or stops).
  void on_leadership(LeadershipCallbacks callbacks);

  // Connects (retrying while the database is unreachable), migrates if configured, stands for
  // election and serves until stop() or a signal. Returns after a graceful shutdown.
  void run();
  // Asks run() to shut down gracefully: stop claiming, drain up to shutdown_grace, step down.
  void stop();
  // Gives up leadership (drain, release, notify) and waits a few renew intervals before standing
  // again, so that another node takes over. No effect on a follower. Safe from any thread.
  void yield();

  // The saga store of this node's schema, for transactional handlers.
  SagaStore sagas() const;

  bool is_leader() const;
  std::int64_t epoch() const;
  // host:port where /metrics is served once run() started it; empty before or when off.
  std::string metrics_address() const;
  // host:port of the console once run() started it; empty before or when off.
  std::string console_address() const;
  const NodeConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
