// Node: wires election (leader/), consumption (worker/) and metrics (metrics/) by events.
// Grant starts the consumer; revoke stops it; shutdown drains, then steps down.
#include "baton/node.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>

#include <spdlog/spdlog.h>

#include "baton/client.h"
#include "baton/detail/migrations.h"
#include "baton/detail/registry.h"
#include "baton/detail/schedule.h"
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
    validate_name("schedule", name);
    if (options.type.empty()) options.type = name;
    validate_name("type", options.type);
    validate_name("queue", options.queue);
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

  std::unique_ptr<metrics::Metrics> metrics;
  std::unique_ptr<worker::Consumer> consumer;
  std::unique_ptr<leader::Elector> elector;
  // What other threads read: set once the elector exists, cleared before it goes away.
  std::atomic<leader::Elector*> live_elector{nullptr};
  std::atomic<bool> metrics_ready{false};
  std::atomic<bool> schema_ready{false};
  std::string metrics_address;  // written before metrics_ready

  detail::ConnectOptions connect_options() const {
    return {.url = config.database_url,
            .schema = config.schema,
            .application_name = detail::node_application_name(config.node_id, config.schema)};
  }

  bool wait_stop(Millis timeout) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, timeout, [this] { return stop_requested; });
  }

  // Connects and brings the schema to this binary's version, retrying while the database is
  // unreachable. False when stopped first; throws on a schema this binary cannot use.
  // Connects, brings the schema to this binary's version and checks the role's privileges,
  // retrying with backoff whatever stands in the way (unreachable database, wrong password,
  // missing or newer schema, missing grants): each is logged once, with what to do, until it
  // changes. False when stopped first.
  bool prepare_schema() {
    std::mt19937_64 rng(std::random_device{}());
    Millis backoff{200};
    std::string last_problem;
    for (;;) {
      std::string problem;
      try {
        auto conn = detail::connect(connect_options());
        if (config.migrate) {
          const int applied = detail::migrate(*conn, config.schema);
          if (applied > 0) {
            spdlog::info("applied {} migration(s) to schema {}", applied, config.schema);
          }
        }
        detail::require_current_schema(*conn, config.schema);
        detail::require_privileges(*conn, config.schema);
        if (!last_problem.empty()) spdlog::info("database ready: {}", config.schema);
        return true;
      } catch (const std::exception& e) {
        problem = detail::is_connection_error(e)
                      ? "database unreachable (" + describe_database_url(config.database_url) +
                            "): " + detail::scrub(e.what())
                      : detail::scrub(e.what());
        while (!problem.empty() && problem.back() == '\n')
          problem.pop_back();
      }
      if (problem != last_problem) {
        spdlog::error("{}; retrying with backoff", problem);
        last_problem = problem;
      }
      std::uniform_int_distribution<std::int64_t> jitter(backoff.count() / 2, backoff.count());
      if (wait_stop(Millis(jitter(rng)))) return false;
      backoff = std::min(backoff * 2, Millis(5000));
    }
  }
};

Node::Node(NodeConfig config) : impl_(new Impl) {
  config.validate();
  impl_->config = std::move(config);
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
  validate_name("type", type);
  impl_->registry.add(type, std::move(handler), retry_policy(type, options, impl_->config));
}

void Node::handle_tx(const std::string& type, TxHandler handler, const HandlerOptions& options) {
  validate_name("type", type);
  impl_->registry.add(type, std::move(handler), retry_policy(type, options, impl_->config));
}

void Node::yield() {
  if (auto* e = impl_->live_elector.load()) e->request_yield();
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
  auto* e = impl_->live_elector.load();
  return e != nullptr && e->is_leader();
}

std::int64_t Node::epoch() const {
  auto* e = impl_->live_elector.load();
  return e != nullptr ? e->epoch() : 0;
}

std::string Node::metrics_address() const {
  return impl_->metrics_ready.load() ? impl_->metrics_address : std::string();
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

  s.metrics = std::make_unique<metrics::Metrics>(c.node_id);
  s.metrics->pool_busy(0, c.threads);
  if (c.metrics_listen != "off") {
    s.metrics->serve(c.metrics_listen, [&s]() -> std::string {
      if (!s.schema_ready.load()) return "database not reached yet, or schema not checked";
      auto* e = s.live_elector.load();
      if (e == nullptr || !e->connected()) return "the election session is not connected";
      return "";
    });
    s.metrics_address = s.metrics->address();
    s.metrics_ready.store(true);
    spdlog::info("serving metrics on http://{}/metrics", s.metrics_address);
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
               .poll_interval = c.poll_interval};
  wc.executor = {.connect = s.connect_options(),
                 .threads = c.threads,
                 .node_id = c.node_id,
                 .retry = {.base = c.retry_base, .cap = c.retry_cap}};
  wc.pruner.retention = c.history_retention;
  wc.periodic = s.periodic;
  s.running = true;
  // The elector is created below; the gate reads it through the Impl.
  s.consumer = std::make_unique<worker::Consumer>(wc, s.registry, s.metrics.get(), s.metrics.get(),
                                                  s.metrics.get(), [&s](std::int64_t epoch) {
                                                    auto* e = s.live_elector.load();
                                                    return e != nullptr && e->leading(epoch);
                                                  });
  s.consumer->start();

  leader::ElectorConfig ec;
  ec.connect = s.connect_options();
  ec.connect.statement_timeout_ms = static_cast<int>(c.lock_ttl.count() / 2);
  // A frozen leader's idle election session is ended by the server soon after it stops renewing.
  ec.connect.idle_session_timeout_ms =
      static_cast<int>(2 * std::max(c.renew_interval, c.retry_interval).count() + 200);
  ec.node_id = c.node_id;
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  ec.host = host.data();
  ec.version = BATON_VERSION;
  ec.metrics_addr = s.metrics_address;
  ec.lock_key = c.lock_key;
  ec.region = c.region;
  ec.ttl = c.lock_ttl;
  ec.renew_interval = c.renew_interval;
  ec.retry_interval = c.retry_interval;
  LeadershipCallbacks cb;
  cb.on_granted = [&s](std::int64_t epoch) {
    s.consumer->granted(epoch);
    for (auto& extra : s.callbacks) {
      if (extra.on_granted) extra.on_granted(epoch);
    }
  };
  cb.on_revoked = [&s](std::int64_t epoch, RevokeReason reason) {
    s.consumer->revoked(epoch);
    for (auto& extra : s.callbacks) {
      if (extra.on_revoked) extra.on_revoked(epoch, reason);
    }
  };
  // A step-down request drains first, so in-flight outcomes land while the lease is still ours.
  auto on_yield_request = [&s] {
    s.consumer->drain(s.config.shutdown_grace);
    if (auto* e = s.live_elector.load()) e->yield();
  };
  s.elector = std::make_unique<leader::Elector>(ec, cb, s.metrics.get(), on_yield_request);
  s.live_elector.store(s.elector.get());
  s.elector->start();

  {
    std::unique_lock lock(s.mutex);
    s.cv.wait(lock, [&s] { return s.stop_requested; });
  }

  // Graceful shutdown: stop claiming, let in-flight jobs finish and their outcomes land while the
  // lease is still ours, then step down so that a follower takes over at once.
  spdlog::info("shutting down: draining in-flight jobs (grace {}ms)", c.shutdown_grace.count());
  const bool clean = s.consumer->drain(c.shutdown_grace);
  s.elector->stop();
  s.consumer->shutdown(Millis(1000));
  s.live_elector.store(nullptr);
  s.consumer.reset();
  s.elector.reset();
  spdlog::info("node {} stopped{}", c.node_id, clean ? "" : " (some jobs were abandoned)");
}

}  // namespace baton
