// Node: wires election (leader/), consumption (worker/) and metrics (metrics/) by events.
// Grant starts the consumer; revoke stops it; shutdown drains, then steps down.
#include "baton/node.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "baton/client.h"
#include "baton/detail/backoff.h"
#include "baton/detail/db.h"
#include "baton/detail/lease.h"
#include "baton/detail/migrations.h"
#include "baton/detail/registry.h"
#include "baton/detail/schedule.h"
#include "baton/detail/text.h"
#include "console/console.h"
#include "leader/balancer.h"
#include "leader/elector.h"
#include "metrics/metrics.h"
#include "signals.h"
#include "worker/consumer.h"
#include "worker/periodic_enqueuer.h"

#ifndef BATON_VERSION
#define BATON_VERSION "0.0.0"
#endif

namespace baton {

struct Node::Impl {
  NodeConfig config;
  detail::HandlerRegistry registry;
  std::vector<LeadershipCallbacks> callbacks;
  std::vector<worker::PeriodicJob> periodic;
  bool running = false;  // run() has begun: no more handlers or schedules

  void add_schedule(const std::string& name, std::unique_ptr<detail::Schedule> schedule,
                    nlohmann::json payload, ScheduleOptions options) {
    if (running) throw std::logic_error("schedule '" + name + "' declared after run()");
    detail::validate_name("schedule", name);
    if (options.type.empty()) options.type = name;
    detail::validate_name("type", options.type);
    detail::validate_name("queue", options.queue);
    if (options.catch_up_limit < 1 || options.max_attempts < 1 || options.max_attempts > 1000) {
      throw ConfigError("schedule '" + name +
                        "': catch_up_limit must be at least 1 and max_attempts 1..1000");
    }
    for (const auto& p : periodic) {
      if (p.name == name) throw std::logic_error("schedule '" + name + "' is declared twice");
    }
    periodic.push_back({name, std::move(schedule), std::move(payload), std::move(options)});
  }

  std::mutex mutex;
  std::condition_variable cv;
  bool stop_requested = false;

  // The electors keep this node's leadership here, one lease per shard (one without shards); the
  // consumer and is_leader() read them.
  std::vector<std::unique_ptr<detail::Lease>> leases;
  std::unique_ptr<metrics::Metrics> metrics;
  std::unique_ptr<worker::Consumer> consumer;
  std::vector<std::unique_ptr<leader::Elector>> electors;  // by shard
  std::unique_ptr<leader::Balancer> balancer;              // with shards only
  // What other threads read: set once the electors exist, cleared before they go away.
  std::atomic<bool> electors_live{false};
  // Guards electors_live against the shutdown: held while a step-down, a hand-over, yield() or
  // the readiness check uses the electors, never across a drain.
  std::mutex yield_mutex;

  std::vector<const detail::Lease*> lease_views() const {
    std::vector<const detail::Lease*> out;
    out.reserve(leases.size());
    for (const auto& l : leases)
      out.push_back(l.get());
    return out;
  }

  // A step-down in progress (one at a time, on a thread of its own: every leading elector asks,
  // and none of their event threads may be held up by the drain; their revokes go on).
  std::atomic<bool> stepping_down{false};
  std::thread step_down_thread;  // under yield_mutex
  bool shutting_down = false;    // under yield_mutex: the shutdown drains; no step-down starts

  ~Impl() {
    if (step_down_thread.joinable()) step_down_thread.join();
  }

  void request_step_down() {
    std::lock_guard lock(yield_mutex);
    if (!electors_live.load() || shutting_down || stepping_down.exchange(true)) return;
    if (step_down_thread.joinable()) step_down_thread.join();  // the last one, ended
    try {
      step_down_thread = std::thread([this] {
        try {
          step_down_all();
        } catch (const std::exception& e) {
          spdlog::error("step-down failed: {}", e.what());
        }
        stepping_down.store(false);
      });
    } catch (const std::exception& e) {
      stepping_down.store(false);
      spdlog::error("step-down not started: {}", e.what());
    }
  }

  // Drains this node's jobs of the shards it leads, then releases them all (a step-down). Runs on
  // the step-down thread.
  void step_down_all() {
    {
      std::lock_guard lock(yield_mutex);
      if (!electors_live.load()) return;
      // With shards, the others take this node's shards (it counts itself out for a while).
      if (balancer) balancer->stand_aside(Millis(2000) + 4 * config.lock_ttl);
    }
    consumer->drain(config.shutdown_grace);
    std::lock_guard lock(yield_mutex);
    if (!electors_live.load()) return;
    for (auto& e : electors)
      e->yield();
  }

  // Drains one shard's jobs, then releases it (a hand-over to a node under its share). Runs on
  // the balancer's hand-over thread. False when it kept the shard.
  bool hand_over(int shard) {
    if (!electors_live.load()) return false;
    const auto epoch = leases.at(static_cast<std::size_t>(shard))->epoch();
    if (epoch == 0) return false;
    if (!consumer->drain_shard(shard, config.shutdown_grace)) return false;
    std::lock_guard lock(yield_mutex);
    if (!electors_live.load()) return false;
    // Only the lease whose jobs drained: one lost and won again meanwhile claims again.
    electors.at(static_cast<std::size_t>(shard))->yield(epoch);
    return true;
  }

  // With shards: the database's count must be this node's. A deployment whose nodes are all
  // stopped takes this node's count (set_shards refuses while a node of another count is live).
  void check_shard_count(pqxx::connection& conn) {
    int current = 1;
    {
      pqxx::nontransaction tx(conn);
      current =
          tx.exec(
                "SELECT coalesce((SELECT value::int FROM settings WHERE key = 'shards'), 1)")[0][0]
              .as<int>();
    }
    if (current == config.shards) return;
    try {
      pqxx::work tx(conn);
      const auto moved =
          tx.exec_params("SELECT set_shards($1, $2)", config.shards, config.node_id)[0][0]
              .as<std::int64_t>();
      tx.commit();
      spdlog::warn("the deployment's shard count changed from {} to {} ({} waiting jobs moved)",
                   current, config.shards, moved);
    } catch (const pqxx::sql_error& e) {
      const std::string how =
          "; start this node with --shards " + std::to_string(current) +
          ", or change the count: stop every node, then start them all with the new --shards "
          "(a role that may run set_shards(), such as the schema owner, sets it; or run "
          "`batonctl shards " +
          std::to_string(config.shards) + "` as one) (docs/concepts.md, \"Shards\")";
      throw std::runtime_error("the deployment has " + std::to_string(current) +
                               " shard(s) and this node was started with --shards " +
                               std::to_string(config.shards) + ": " +
                               detail::one_line(detail::scrub(e.what()), 300) + how);
    }
  }
  std::atomic<bool> metrics_ready{false};
  std::atomic<bool> schema_ready{false};
  std::string metrics_address;  // written before metrics_ready
  std::unique_ptr<console::Console> console;
  std::atomic<bool> console_ready{false};
  std::string console_address;  // written before console_ready

  // The sessions that must stay one server session (election, claims, outcomes, services) use
  // the election URL; handlers' transactions use the database URL (which may be pooled).
  detail::ConnectOptions connect_options(bool session = true) const {
    const auto& url = session && !config.election_database_url.empty()
                          ? config.election_database_url
                          : config.database_url;
    return {.url = url,
            .schema = config.schema,
            .application_name = detail::node_application_name(config.node_id, config.schema)};
  }

  bool wait_stop(Millis timeout) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, timeout, [this] { return stop_requested; });
  }

  // Connects, brings the schema to this binary's version and checks the role's privileges,
  // retrying with backoff whatever stands in the way (unreachable database, wrong password,
  // missing or newer schema, missing grants): each is logged once, with what to do, until it
  // changes. False when stopped first.
  bool prepare_schema() {
    detail::Backoff backoff(Millis(200), Millis(5000));
    std::string last_problem;
    bool migration_waited = false;
    for (;;) {
      std::string problem;
      try {
        // A transaction pooler in front of the election's sessions would make leadership churn
        // without end: refuse it, saying what to do.
        if (const auto pooled = detail::transaction_pooling(connect_options()); !pooled.empty()) {
          throw ConfigError(pooled);
        }
        auto conn = detail::connect(connect_options());
        if (config.migrate) {
          const int applied =
              detail::migrate(*conn, config.schema, 0, detail::kNodeMigrationLockWait);
          if (applied > 0) {
            spdlog::info("applied {} migration(s) to schema {}", applied, config.schema);
          }
        }
        detail::require_current_schema(*conn, config.schema);
        detail::require_privileges(*conn, config.schema);
        check_shard_count(*conn);
        if (!last_problem.empty()) spdlog::info("database ready: {}", config.schema);
        return true;
      } catch (const ConfigError&) {
        throw;
      } catch (const detail::MigrationLockWait& e) {
        problem = e.what();  // one line, scrubbed
        migration_waited = true;
        if (metrics != nullptr) metrics->database_error("migrate");
      } catch (const std::exception& e) {
        if (detail::is_authentication_error(e)) {
          // Not "unreachable": the server answered and refused these credentials.
          problem = "database AUTHENTICATION FAILED (" +
                    describe_database_url(config.database_url) +
                    "): " + detail::one_line(detail::scrub(e.what())) +
                    "; check the password (DATABASE_URL, a .pgpass file or PGPASSWORD) and the "
                    "role's pg_hba.conf entry";
          if (metrics != nullptr) metrics->authentication_failed();
        } else if (detail::is_connection_error(e)) {
          problem = "database unreachable (" + describe_database_url(config.database_url) +
                    "): " + detail::one_line(detail::scrub(e.what()));
        } else {
          problem = detail::one_line(detail::scrub(e.what()));
        }
        if (metrics != nullptr) metrics->database_error("connect");
      }
      if (problem != last_problem) {
        spdlog::error("{}; retrying with backoff", problem);
        last_problem = problem;
      }
      // Each try at a migration's locks holds the queue for its lock wait: not every few seconds.
      const auto wait =
          std::exchange(migration_waited, false)
              ? detail::Backoff(detail::kMigrationRetry, detail::kMigrationRetry).next_jittered()
              : backoff.next_jittered();
      if (wait_stop(wait)) return false;
    }
  }
};

Node::Node(NodeConfig config) : impl_(new Impl) {
  config.validate();
  impl_->config = std::move(config);
  // Made here, before run() starts, so is_leader() and epoch() never race with their making.
  for (int k = 0; k < impl_->config.shards; ++k)
    impl_->leases.push_back(std::make_unique<detail::Lease>());
}

Node::~Node() = default;

namespace {

// The handler's own retry policy, when it sets any of it; validated like the node's settings.
std::optional<detail::RetryPolicy> retry_policy(const std::string& type, const HandlerOptions& o,
                                                const NodeConfig& config) {
  if (!o.retry_base && !o.retry_cap && o.retry_factor == 2.0) return std::nullopt;
  detail::RetryPolicy p{o.retry_base.value_or(config.retry_base),
                        o.retry_cap.value_or(config.retry_cap), o.retry_factor};
  if (p.base.count() <= 0 || p.cap < p.base || !(p.factor >= 1.0 && p.factor <= 10.0)) {
    throw ConfigError("handler '" + type +
                      "': retry_base must be positive, retry_cap at least retry_base, and "
                      "retry_factor within 1..10");
  }
  return p;
}

}  // namespace

void Node::handle(const std::string& type, Handler handler, const HandlerOptions& options) {
  detail::validate_name("type", type);
  impl_->registry.add(type, std::move(handler), retry_policy(type, options, impl_->config));
}

void Node::handle_tx(const std::string& type, TxHandler handler, const HandlerOptions& options) {
  detail::validate_name("type", type);
  impl_->registry.add(type, std::move(handler), retry_policy(type, options, impl_->config));
}

void Node::yield() {
  std::lock_guard lock(impl_->yield_mutex);
  if (!impl_->electors_live.load()) return;
  for (auto& e : impl_->electors)
    e->request_step_down();
}

void Node::every(std::chrono::milliseconds interval, const std::string& name,
                 nlohmann::json payload, ScheduleOptions options) {
  impl_->add_schedule(name, detail::every(interval), std::move(payload), std::move(options));
}

void Node::every(std::string_view interval, const std::string& name, nlohmann::json payload,
                 ScheduleOptions options) {
  every(parse_duration(interval, "every"), name, std::move(payload), std::move(options));
}

void Node::cron(const std::string& expression, const std::string& name, nlohmann::json payload,
                const std::string& tz, ScheduleOptions options) {
  impl_->add_schedule(name, detail::cron(expression, tz), std::move(payload), std::move(options));
}

void Node::on_leadership(LeadershipCallbacks callbacks) {
  impl_->callbacks.push_back(std::move(callbacks));
}

void Node::stop() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stop_requested = true;
  }
  impl_->cv.notify_all();
}

SagaStore Node::sagas() const {
  return SagaStore(impl_->config.schema);
}

bool Node::is_leader() const {
  for (const auto& l : impl_->leases) {
    if (l->valid(l->epoch())) return true;
  }
  return false;
}

std::int64_t Node::epoch() const {
  for (const auto& l : impl_->leases) {
    if (const auto e = l->epoch(); e != 0) return e;
  }
  return 0;
}

std::string Node::metrics_address() const {
  return impl_->metrics_ready.load() ? impl_->metrics_address : std::string();
}

std::string Node::console_address() const {
  return impl_->console_ready.load() ? impl_->console_address : std::string();
}

const NodeConfig& Node::config() const {
  return impl_->config;
}

void Node::run() {
  auto& s = *impl_;
  const auto& c = s.config;
  std::unique_ptr<detail::SignalWatcher> signals;
  if (c.handle_signals) {
    signals = std::make_unique<detail::SignalWatcher>([this](int n) {
      if (n == 1) {
        spdlog::info(
            "signal received: stopping gracefully (a second signal abandons running jobs)");
        stop();
      } else {
        spdlog::warn("second signal: exiting now; running jobs will be rescued by the next leader");
        spdlog::default_logger()->flush();
        std::_Exit(1);
      }
    });
  }
  spdlog::info("node {} starting: database {} schema {} threads {}", c.node_id,
               describe_database_url(c.database_url), c.schema, c.threads);

  s.metrics = std::make_unique<metrics::Metrics>(c.node_id, c.deployment(), c.shards);
  s.metrics->pool_busy(0, c.threads, c.threads);
  if (c.metrics_listen != "off") {
    s.metrics->serve(c.metrics_listen, [&s]() -> std::string {
      if (!s.schema_ready.load()) return "database not reached yet, or schema not checked";
      // Not ready once the database stopped answering the election session (a partition): the
      // node cannot lead, and if it led it has stepped down.
      std::lock_guard lock(s.yield_mutex);
      if (!s.electors_live.load() ||
          !s.electors[0]->reachable(std::max(s.config.lock_ttl, Millis(1000)))) {
        return "the database does not answer the election session";
      }
      return "";
    });
    s.metrics_address = s.metrics->address();
    s.metrics_ready.store(true);
    spdlog::info("serving metrics on http://{}/metrics", s.metrics_address);
  }
  if (c.console_listen != "off") {
    console::ConsoleConfig cc;
    cc.listen = c.console_listen;
    cc.connect = s.connect_options();
    if (!c.console_database_url.empty()) cc.connect.url = c.console_database_url;
    // A page's query never runs long, and never holds a transaction open.
    cc.connect.statement_timeout_ms = 5000;
    cc.connect.idle_in_transaction_timeout_ms = 10000;
    cc.node_id = c.node_id;
    cc.version = BATON_VERSION;
    if (!c.console_token_file.empty()) cc.token = console::read_token_file(c.console_token_file);
    cc.read_only = c.console_read_only;
    cc.observe = [m = s.metrics.get()](std::string_view kind, int status) {
      m->console_request(kind, status);
    };
    s.console = std::make_unique<console::Console>(std::move(cc));
    s.console_address = s.console->address();
    s.console_ready.store(true);
    spdlog::info("serving the console on http://{}/{}{}", s.console_address,
                 c.console_token_file.empty() ? "" : " (token required)",
                 c.console_read_only ? " (read-only)" : "");
  }

  if (!s.prepare_schema()) return;
  s.schema_ready.store(true);
  // batonctl drill enqueues this probe to time the first job of a new leader.
  if (s.registry.find("baton.drill") == nullptr) s.registry.add("baton.drill", [](JobContext&) {});
  s.registry.freeze();

  worker::ConsumerConfig wc;
  wc.poller = {.connect = s.connect_options(),
               .node_id = c.node_id,
               .lock = {c.lock_key, c.region},
               .queues = c.queues,
               .queue_limits = c.queue_concurrency,
               .batch_size = c.batch_size,
               .poll_interval = c.poll_interval,
               .claim_gather = std::min(c.claim_gather, c.poll_interval),
               .claim_time = 3 * c.local_lease()};
  wc.executor = {.connect = s.connect_options(false),
                 .pooled = !c.election_database_url.empty(),
                 .threads = c.threads,
                 .node_id = c.node_id,
                 .retry = {.base = c.retry_base, .cap = c.retry_cap}};
  wc.pruner.retention = c.history_retention;
  wc.rescuer.deposed_after = c.lock_ttl;
  wc.periodic = s.periodic;
  wc.shards = c.shards;
  s.running = true;
  s.consumer = std::make_unique<worker::Consumer>(wc, s.registry, s.metrics.get(), s.metrics.get(),
                                                  s.metrics.get(), s.lease_views());
  s.consumer->start();

  std::vector<std::string> lock_keys;
  lock_keys.reserve(static_cast<std::size_t>(c.shards));
  for (int k = 0; k < c.shards; ++k)
    lock_keys.push_back(worker::shard_lock({c.lock_key, c.region}, k).lock_key);
  if (c.shards > 1) {
    leader::BalancerConfig bc;
    bc.connect = s.connect_options();
    bc.node_id = c.node_id;
    bc.region = c.region;
    bc.lock_keys = lock_keys;
    bc.node_group = detail::LockName{c.lock_key, c.region}.group();
    bc.interval = c.retry_interval;
    // A shard whose jobs did not drain within the grace claims again for a while before the
    // next try, so that its queue is stopped a quarter of the time at most.
    bc.hand_over_retry = std::max(Millis(1000), 3 * c.shutdown_grace);
    s.balancer = std::make_unique<leader::Balancer>(
        bc,
        leader::BalancerHooks{[&s](int shard) { return s.hand_over(shard); },
                              [&s] {
                                if (!s.electors_live.load()) return;
                                for (auto& e : s.electors)
                                  e->nudge();
                              }},
        s.lease_views());
  }

  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  for (int k = 0; k < c.shards; ++k) {
    leader::ElectorConfig ec;
    ec.connect = s.connect_options();
    ec.node_id = c.node_id;
    ec.host = host.data();
    ec.version = BATON_VERSION;
    ec.metrics_addr = s.metrics_address;
    ec.handles = s.registry.types();
    ec.lock_key = lock_keys[static_cast<std::size_t>(k)];
    ec.region = c.region;
    ec.ttl = c.lock_ttl;
    ec.lease = c.local_lease();
    ec.renew_interval = c.renew_interval;
    ec.retry_interval = c.retry_interval;
    ec.shards = c.shards;
    if (c.shards > 1) {
      // Shard 0's elector writes the node's row, for every shard.
      ec.writes_node_row = k == 0;
      ec.node_group = detail::LockName{c.lock_key, c.region}.group();
      ec.node_state = [&s] {
        leader::NodeRowState state{"follower", 0, {}};
        for (std::size_t i = 0; i < s.leases.size(); ++i) {
          if (const auto e = s.leases[i]->epoch(); e != 0) {
            state.shards_led.push_back(static_cast<int>(i));
            if (state.epoch == 0) state.epoch = e;
          }
        }
        if (!state.shards_led.empty()) state.role = "leader";
        if (s.balancer->aside()) state.role = "stepping_down";
        return state;
      };
      ec.may_stand = [b = s.balancer.get(), k] { return b->may_stand(k); };
      ec.stood = [b = s.balancer.get(), k](bool won) { b->stood(k, won); };
      ec.may_be_stranger = [b = s.balancer.get(), k] { return b->may_be_stranger(k); };
      ec.label = "shard=" + std::to_string(k) + " ";
    }
    // The elector's events, routed: it knows neither the consumer nor the callbacks.
    leader::ElectorEvents events;
    events.granted = [&s, k](std::int64_t epoch) {
      s.consumer->granted(k, epoch);
      for (auto& extra : s.callbacks) {
        if (extra.on_granted) extra.on_granted(epoch);
      }
    };
    events.revoked = [&s, k](std::int64_t epoch, RevokeReason reason) {
      s.consumer->revoked(k, epoch);
      for (auto& extra : s.callbacks) {
        if (extra.on_revoked) extra.on_revoked(epoch, reason);
      }
    };
    // A step-down drains first, so in-flight outcomes land while the leases are still ours; it
    // releases every shard this node leads.
    events.step_down_requested = [&s](std::int64_t) { s.request_step_down(); };
    s.electors.push_back(std::make_unique<leader::Elector>(
        ec, events, *s.leases[static_cast<std::size_t>(k)], s.metrics->shard_observer(k)));
  }
  s.electors_live.store(true);
  if (s.balancer) s.balancer->start();
  for (auto& e : s.electors)
    e->start();

  {
    std::unique_lock lock(s.mutex);
    s.cv.wait(lock, [&s] { return s.stop_requested; });
  }

  // Graceful shutdown: stop claiming, let in-flight jobs finish and their outcomes land while the
  // lease is still ours, then step down so that a follower takes over at once. Nothing here waits
  // on the network past its bound: calls in flight are cut (detail/call_watch.h).
  spdlog::info("shutting down: draining in-flight jobs (grace {}ms)", c.shutdown_grace.count());
  // With shards: stand for nothing more (the others count this node out and take its shards the
  // moment they are released).
  if (s.balancer) s.balancer->stand_aside(Millis(24L * 3600 * 1000));
  {
    std::lock_guard lock(s.yield_mutex);
    s.shutting_down = true;
  }
  const bool clean = s.consumer->drain(c.shutdown_grace);
  // Its hand-over in progress, if any, has drained by now (the same grace) and releases.
  if (s.balancer) s.balancer->stop();
  {
    std::lock_guard lock(s.yield_mutex);  // no step-down or hand-over from here on
    s.electors_live.store(false);
  }
  // A step-down begun before the shutdown has drained by now too (it started earlier, with the
  // same grace), and finds no electors.
  if (s.step_down_thread.joinable()) s.step_down_thread.join();
  // Shard 0's elector last: it marks the node's row stopped.
  for (auto it = s.electors.rbegin(); it != s.electors.rend(); ++it)
    (*it)->stop();
  const bool idle = s.consumer->shutdown(Millis(500));
  if (idle) {
    s.consumer.reset();
  } else {
    // Handlers that ignored cancellation still run on the consumer's threads: abandon them, and
    // the objects they use with them (joining would wait for them for ever).
    spdlog::warn("abandoning handlers that are still running; they are rescued by the next leader");
    static_cast<void>(s.consumer.release());
    static_cast<void>(s.metrics.release());
  }
  s.electors.clear();
  s.balancer.reset();
  s.console_ready.store(false);
  s.console.reset();
  spdlog::info("node {} stopped{}", c.node_id, clean ? "" : " (some jobs were abandoned)");
}

}  // namespace baton
