// Metric families and their updates. Label values are bounded: queue, type, outcome and reason,
// never job ids.
#include "metrics/metrics.h"

#include <array>
#include <chrono>
#include <map>
#include <stdexcept>

#include "baton/detail/clock.h"
#include "baton/detail/enqueue_counts.h"
#include "metrics/process_collector.h"

namespace baton::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Resolves both 1 ms and 10 min.
const prometheus::Histogram::BucketBoundaries& time_buckets() {
  static const prometheus::Histogram::BucketBoundaries b{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                         0.1,   0.25,   0.5,   1,    2.5,   5,
                                                         10,    30,     60,    120,  300,   600};
  return b;
}

// A claim of one job took about 0.3 ms on a 2-core VM; one still out at the lease's end is cut.
const prometheus::Histogram::BucketBoundaries& claim_buckets() {
  static const prometheus::Histogram::BucketBoundaries b{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  return b;
}

}  // namespace

// Values that only make sense at scrape time: the age of this leader's lease, and the jobs the
// Clients of this process enqueued.
class Metrics::Live final : public prometheus::Collectable {
 public:
  void lease_renewed(int shard) {
    renewed_ns_.at(static_cast<std::size_t>(shard)).store(detail::steady_now_ns());
  }
  void lease_lost(int shard) { renewed_ns_.at(static_cast<std::size_t>(shard)).store(0); }
  void set_shards(int shards) { shards_.store(shards); }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    prometheus::MetricFamily age{"baton_lease_age_seconds",
                                 "Time since this leader last renewed its lease (absent on "
                                 "followers). Above the ttl, the lease is lost.",
                                 prometheus::MetricType::Gauge,
                                 {}};
    const int shards = shards_.load();
    for (int k = 0; k < shards; ++k) {
      if (const auto at = renewed_ns_[static_cast<std::size_t>(k)].load(); at != 0) {
        prometheus::ClientMetric m;
        if (shards > 1) m.label = {{"shard", std::to_string(k)}};
        m.gauge.value = static_cast<double>(detail::steady_now_ns() - at) / 1e9;
        age.metric.push_back(m);
      }
    }
    out.push_back(std::move(age));
    prometheus::MetricFamily enq{"baton_jobs_enqueued_total",
                                 "Jobs enqueued by baton::Client instances in this process.",
                                 prometheus::MetricType::Counter,
                                 {}};
    for (const auto& [key, n] : detail::enqueued_counts()) {
      prometheus::ClientMetric m;
      m.label = {{"queue", key.first}, {"type", key.second}};
      m.counter.value = static_cast<double>(n);
      enq.metric.push_back(m);
    }
    out.push_back(std::move(enq));
    return out;
  }

 private:
  std::array<std::atomic<std::int64_t>, kMaxShards> renewed_ns_{};  // by shard; 0: not leading
  std::atomic<int> shards_{1};
};

// One shard's leadership, as its elector reports it (a deployment with shards).
class Metrics::ShardObserver final : public detail::LeaderObserver {
 public:
  ShardObserver(Metrics& m, int shard) : m_(m), shard_(shard) {}
  void database_error(std::string_view component) override { m_.database_error(component); }
  void authentication_failed() override { m_.authentication_failed(); }
  void granted(std::int64_t epoch, double failover_seconds) override {
    m_.shard_granted(shard_, epoch, failover_seconds);
  }
  void revoked(std::int64_t epoch, std::string_view reason) override {
    m_.shard_revoked(shard_, epoch, reason);
  }
  void renewed() override { m_.live_->lease_renewed(shard_); }
  void renewal_took(double seconds) override { m_.renewal_took(seconds); }
  void renewal_failed() override { m_.renewal_failed(); }
  void evicted_holder() override { m_.evicted_holder(); }
  void stranger_holds_lock(bool holds) override { m_.stranger_holds_lock(holds); }

 private:
  Metrics& m_;
  const int shard_;
};

Metrics::Metrics(const std::string& node_id, std::string deployment, int shards)
    : deployment_(std::move(deployment)),
      registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessCollector>()),
      live_(std::make_shared<Live>()),
      started_(BuildCounter()
                   .Name("baton_jobs_started_total")
                   .Help("Job runs started by this node's handlers, by queue and type.")
                   .Register(*registry_)),
      completed_(BuildCounter()
                     .Name("baton_jobs_completed_total")
                     .Help("Job runs that returned successfully on this node.")
                     .Register(*registry_)),
      failed_(BuildCounter()
                  .Name("baton_jobs_failed_total")
                  .Help("Job runs that failed on this node (threw, timed out or had no handler).")
                  .Register(*registry_)),
      retried_(BuildCounter()
                   .Name("baton_jobs_retried_total")
                   .Help("Failed job runs scheduled for another attempt.")
                   .Register(*registry_)),
      dead_(BuildCounter()
                .Name("baton_jobs_dead_total")
                .Help("Failed job runs moved to dead_jobs (no attempts left, or never runnable).")
                .Register(*registry_)),
      wait_(BuildHistogram()
                .Name("baton_job_wait_seconds")
                .Help("Time from a job's run_at to its start, by queue (database clock).")
                .Register(*registry_)),
      run_(BuildHistogram()
               .Name("baton_job_run_seconds")
               .Help("Handler run time, by queue.")
               .Register(*registry_)),
      total_(BuildHistogram()
                 .Name("baton_job_end_to_end_seconds")
                 .Help("Time from enqueue to the end of a run, by queue (database clock to "
                       "claim, plus run time).")
                 .Register(*registry_)),
      leadership_changes_(BuildCounter()
                              .Name("baton_leadership_changes_total")
                              .Help("Leadership grants and revokes of this node, by reason.")
                              .Register(*registry_)),
      db_errors_(BuildCounter()
                     .Name("baton_database_errors_total")
                     .Help("Database errors in this node's loops, by component (connect, "
                           "migrate, elector, poller, completer, rescuer, pruner, "
                           "depth_sampler, executor).")
                     .Register(*registry_)),
      auth_failures_(BuildCounter()
                         .Name("baton_database_authentication_failures_total")
                         .Help("Connections the database refused for their credentials (wrong "
                               "password, no pg_hba.conf entry); the node keeps retrying.")
                         .Register(*registry_)
                         .Add({})),
      console_requests_(BuildCounter()
                            .Name("baton_console_requests_total")
                            .Help("Requests the console answered, by kind (page, read, action) "
                                  "and HTTP status.")
                            .Register(*registry_)),
      leader_family_(BuildGauge()
                         .Name("baton_leader")
                         .Help("1 while this node is the leader, else 0 (with shards: of each "
                               "shard, by shard).")
                         .Register(*registry_)),
      epoch_family_(BuildGauge()
                        .Name("baton_leader_epoch")
                        .Help("Fencing epoch of this node's current or last leadership (with "
                              "shards: by shard).")
                        .Register(*registry_)),
      shards_led_(BuildGauge()
                      .Name("baton_shards_led")
                      .Help("Shards this node leads now (1 or 0 without shards).")
                      .Register(*registry_)
                      .Add({})),
      last_failover_(BuildGauge()
                         .Name("baton_last_failover_seconds")
                         .Help("Time from the previous leader's last renewal to this node's "
                               "grant, at this node's last takeover (database clock).")
                         .Register(*registry_)
                         .Add({})),
      fenced_(BuildCounter()
                  .Name("baton_fenced_total")
                  .Help("Job outcomes refused because the job belonged to a newer epoch, by "
                        "queue and type.")
                  .Register(*registry_)),
      released_(BuildCounter()
                    .Name("baton_jobs_released_total")
                    .Help("Claimed jobs that had not started when their epoch ended, put back "
                          "in the queue with their attempt.")
                    .Register(*registry_)
                    .Add({})),
      renewal_failures_(BuildCounter()
                            .Name("baton_lease_renewal_failures_total")
                            .Help("Lease renewals that failed or ran out.")
                            .Register(*registry_)
                            .Add({})),
      renewal_seconds_(
          BuildHistogram()
              .Name("baton_lease_renewal_seconds")
              .Help("Time each lease renewal of this leader took (with shards: every shard's), "
                    "answered or not: one cut at the lease's end counts its time until then. "
                    "With the defaults, renewals of about 150 ms each lose the lease.")
              .Register(*registry_)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                               0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5,
                                                               1, 2, 5})),
      evictions_(BuildCounter()
                     .Name("baton_evictions_total")
                     .Help("Stale leaders this node evicted with pg_terminate_backend.")
                     .Register(*registry_)
                     .Add({})),
      stranger_(BuildGauge()
                    .Name("baton_lock_held_by_stranger")
                    .Help("1 while a session that is not a baton node holds the leader lock and "
                          "no node leads (seen by this follower), else 0.")
                    .Register(*registry_)
                    .Add({})),
      pool_threads_(BuildGauge()
                        .Name("baton_pool_threads")
                        .Help("Handler threads in this node's pool.")
                        .Register(*registry_)
                        .Add({})),
      pool_concurrency_(BuildGauge()
                            .Name("baton_pool_concurrency")
                            .Help("Jobs the pool runs at once now: adapted to how much of a run's "
                                  "time is CPU, at most baton_pool_threads (all of them while "
                                  "queued jobs have waited 1 s with none starting).")
                            .Register(*registry_)
                            .Add({})),
      pool_busy_(BuildGauge()
                     .Name("baton_pool_busy_threads")
                     .Help("Handler threads running a job now.")
                     .Register(*registry_)
                     .Add({})),
      claimed_waiting_(BuildGauge()
                           .Name("baton_jobs_claimed_not_started")
                           .Help("Jobs handed to the pool that no thread has started yet.")
                           .Register(*registry_)
                           .Add({})),
      completer_pending_(BuildGauge()
                             .Name("baton_completer_pending")
                             .Help("Job outcomes waiting to be written to the database.")
                             .Register(*registry_)
                             .Add({})),
      claim_seconds_(BuildHistogram()
                         .Name("baton_claim_seconds")
                         .Help("Time each claim took, from just before its send to its rows "
                               "read; result is jobs or empty. A claim that found jobs is on "
                               "every job's way from the queue to a thread.")
                         .Register(*registry_)),
      claims_with_jobs_(claim_seconds_.Add({{"result", "jobs"}}, claim_buckets())),
      claims_empty_(claim_seconds_.Add({{"result", "empty"}}, claim_buckets())),
      claims_cut_(BuildCounter()
                      .Name("baton_claims_cut_total")
                      .Help("Claims that ended without an answer while this node led: "
                            "row_locked (waited out the lock timeout on a row another "
                            "transaction holds; held rows are then skipped for a minute), "
                            "lease_end (still running three leases after it was sent) or "
                            "statement_timeout (still running then); later claims take fewer "
                            "jobs. Their jobs stay in the queue.")
                      .Register(*registry_)),
      cut_row_locked_(claims_cut_.Add({{"reason", "row_locked"}})),
      cut_lease_end_(claims_cut_.Add({{"reason", "lease_end"}})),
      cut_statement_timeout_(claims_cut_.Add({{"reason", "statement_timeout"}})),
      claim_gathers_(BuildCounter()
                         .Name("baton_claim_gathers_total")
                         .Help("Times the leader waited --claim-gather before a claim, so that "
                               "the claim takes what a stream of jobs brought meanwhile.")
                         .Register(*registry_)
                         .Add({})),
      claim_gather_seconds_(BuildCounter()
                                .Name("baton_claim_gather_seconds_total")
                                .Help("Time the leader spent in those waits.")
                                .Register(*registry_)
                                .Add({})),
      depth_(
          BuildGauge()
              .Name("baton_queue_depth")
              .Help("Jobs in the live queue by state (available: due now; scheduled: run_at "
                    "in the future; running). Exact counts sampled by the leader only, every 5 s "
                    "or every 20x the last sample's duration when longer.")
              .Register(*registry_)),
      oldest_(BuildGauge()
                  .Name("baton_queue_oldest_available_seconds")
                  .Help("Age of the oldest due, unclaimed job per queue (0 when none). Sampled "
                        "by the leader only.")
                  .Register(*registry_)),
      dead_jobs_(BuildGauge()
                     .Name("baton_dead_jobs")
                     .Help("Rows in dead_jobs per queue. Sampled by the leader only.")
                     .Register(*registry_)),
      unhandled_(BuildGauge()
                     .Name("baton_jobs_without_handler")
                     .Help("Due jobs waiting because the leader has no handler for their type "
                           "(a rolling deploy, or a type no node handles), by queue and type. "
                           "Sampled by the leader only.")
                     .Register(*registry_)),
      unhandled_oldest_(BuildGauge()
                            .Name("baton_jobs_without_handler_oldest_seconds")
                            .Help("Age of the oldest due job waiting for a handler, by queue and "
                                  "type. Sampled by the leader only.")
                            .Register(*registry_)),
      schedule_lag_(BuildGauge()
                        .Name("baton_schedule_lag_seconds")
                        .Help("How late this leader enqueued the last tick of a schedule, after "
                              "its scheduled time (database clock).")
                        .Register(*registry_)),
      schedule_ticks_(BuildCounter()
                          .Name("baton_schedule_ticks_total")
                          .Help("Ticks of a schedule this node enqueued.")
                          .Register(*registry_)) {
  BuildGauge()
      .Name("baton_node_info")
      .Help("Constant 1, labelled with this node's id.")
      .Register(*registry_)
      .Add({{"node", node_id}})
      .Set(1);
  set_shards(shards);
}

Metrics::~Metrics() {
  server_.reset();
}

void Metrics::serve(const std::string& listen, HttpServer::Readiness ready,
                    std::vector<detail::http::Route> extra) {
  server_ = std::make_unique<HttpServer>(
      listen, std::vector<std::weak_ptr<prometheus::Collectable>>{registry_, process_, live_},
      std::move(ready), std::vector<prometheus::ClientMetric::Label>{{"deployment", deployment_}},
      std::move(extra));
}

void Metrics::database_error(std::string_view component) {
  db_errors_.Add({{"component", std::string(component)}}).Increment();
}

void Metrics::authentication_failed() {
  auth_failures_.Increment();
}

void Metrics::console_request(std::string_view kind, int status) {
  console_requests_.Add({{"kind", std::string(kind)}, {"code", std::to_string(status)}})
      .Increment();
}

void Metrics::claimed_waiting(int count) {
  claimed_waiting_.Set(count);
}

void Metrics::completer_pending(std::size_t count) {
  completer_pending_.Set(static_cast<double>(count));
}

void Metrics::claim_took(double seconds, bool found_jobs) {
  (found_jobs ? claims_with_jobs_ : claims_empty_).Observe(seconds);
}

void Metrics::claim_cut(detail::ClaimCut reason) {
  switch (reason) {
    case detail::ClaimCut::row_locked:
      cut_row_locked_.Increment();
      break;
    case detail::ClaimCut::lease_end:
      cut_lease_end_.Increment();
      break;
    case detail::ClaimCut::statement_timeout:
      cut_statement_timeout_.Increment();
      break;
  }
}

void Metrics::claim_gathered(double seconds) {
  claim_gathers_.Increment();
  claim_gather_seconds_.Increment(seconds);
}

Metrics::JobSeries& Metrics::series(std::string_view queue, std::string_view type) {
  std::string key;
  key.reserve(queue.size() + type.size() + 1);
  key.append(queue).push_back('\n');
  key.append(type);
  std::lock_guard lock(mutex_);
  auto it = series_.find(key);
  if (it != series_.end()) return it->second;
  const std::map<std::string, std::string> qt{{"queue", std::string(queue)},
                                              {"type", std::string(type)}};
  const std::map<std::string, std::string> q{{"queue", std::string(queue)}};
  JobSeries s{&started_.Add(qt),
              &completed_.Add(qt),
              &failed_.Add(qt),
              &retried_.Add(qt),
              &dead_.Add(qt),
              &wait_.Add(q, time_buckets()),
              &run_.Add(q, time_buckets()),
              &total_.Add(q, time_buckets())};
  return series_.emplace(std::move(key), s).first->second;
}

void Metrics::job_started(std::string_view queue, std::string_view type, double wait_seconds) {
  auto& s = series(queue, type);
  s.started->Increment();
  s.wait->Observe(wait_seconds < 0 ? 0 : wait_seconds);
}

void Metrics::job_finished(std::string_view queue, std::string_view type, detail::Outcome outcome,
                           double run_seconds, double total_seconds) {
  auto& s = series(queue, type);
  s.run->Observe(run_seconds);
  s.total->Observe(total_seconds < 0 ? 0 : total_seconds);
  switch (outcome) {
    case detail::Outcome::completed:
      s.completed->Increment();
      break;
    case detail::Outcome::retried:
      s.failed->Increment();
      s.retried->Increment();
      break;
    case detail::Outcome::dead:
      s.failed->Increment();
      s.dead->Increment();
      break;
  }
}

void Metrics::queue_depths(const std::vector<detail::QueueDepth>& depths) {
  std::lock_guard lock(mutex_);
  std::set<std::string> now;
  for (const auto& d : depths) {
    now.insert(d.queue);
    depth_.Add({{"queue", d.queue}, {"state", "available"}}).Set(static_cast<double>(d.available));
    depth_.Add({{"queue", d.queue}, {"state", "scheduled"}}).Set(static_cast<double>(d.scheduled));
    depth_.Add({{"queue", d.queue}, {"state", "running"}}).Set(static_cast<double>(d.running));
    oldest_.Add({{"queue", d.queue}}).Set(d.oldest_available_seconds);
    dead_jobs_.Add({{"queue", d.queue}}).Set(static_cast<double>(d.dead));
  }
  // A queue with no jobs left reads 0 rather than its last value.
  for (const auto& q : sampled_queues_) {
    if (now.count(q) != 0) continue;
    for (const char* state : {"available", "scheduled", "running"}) {
      depth_.Add({{"queue", q}, {"state", state}}).Set(0);
    }
    oldest_.Add({{"queue", q}}).Set(0);
    dead_jobs_.Add({{"queue", q}}).Set(0);
  }
  sampled_queues_.insert(now.begin(), now.end());
}

void Metrics::unhandled_jobs(const std::vector<detail::UnhandledJobs>& jobs) {
  std::lock_guard lock(mutex_);
  std::set<std::pair<std::string, std::string>> now;
  for (const auto& j : jobs) {
    now.emplace(j.queue, j.type);
    unhandled_.Add({{"queue", j.queue}, {"type", j.type}}).Set(static_cast<double>(j.count));
    unhandled_oldest_.Add({{"queue", j.queue}, {"type", j.type}}).Set(j.oldest_seconds);
  }
  for (const auto& [queue, type] : unhandled_kinds_) {
    if (now.count({queue, type}) != 0) continue;
    unhandled_.Remove(&unhandled_.Add({{"queue", queue}, {"type", type}}));
    unhandled_oldest_.Remove(&unhandled_oldest_.Add({{"queue", queue}, {"type", type}}));
  }
  unhandled_kinds_ = std::move(now);
}

void Metrics::queue_depths_cleared() {
  std::lock_guard lock(mutex_);
  for (const auto& [queue, type] : unhandled_kinds_) {
    unhandled_.Remove(&unhandled_.Add({{"queue", queue}, {"type", type}}));
    unhandled_oldest_.Remove(&unhandled_oldest_.Add({{"queue", queue}, {"type", type}}));
  }
  unhandled_kinds_.clear();
  for (const auto& q : sampled_queues_) {
    for (const char* state : {"available", "scheduled", "running"}) {
      depth_.Remove(&depth_.Add({{"queue", q}, {"state", state}}));
    }
    oldest_.Remove(&oldest_.Add({{"queue", q}}));
    dead_jobs_.Remove(&dead_jobs_.Add({{"queue", q}}));
  }
  sampled_queues_.clear();
}

void Metrics::tick_enqueued(std::string_view schedule, double lag_seconds) {
  const std::map<std::string, std::string> labels{{"schedule", std::string(schedule)}};
  schedule_lag_.Add(labels).Set(lag_seconds);
  schedule_ticks_.Add(labels).Increment();
}

void Metrics::jobs_fenced(std::string_view queue, std::string_view type, std::size_t count) {
  fenced_.Add({{"queue", std::string(queue)}, {"type", std::string(type)}})
      .Increment(static_cast<double>(count));
}

void Metrics::jobs_released(std::size_t count) {
  released_.Increment(static_cast<double>(count));
}

void Metrics::pool_busy(int busy, int threads, int concurrency) {
  pool_busy_.Set(busy);
  pool_threads_.Set(threads);
  pool_concurrency_.Set(concurrency);
}

void Metrics::set_shards(int shards) {
  if (shards < 1 || shards > kMaxShards) throw std::logic_error("Metrics: shards out of range");
  std::lock_guard lock(mutex_);
  if (!leaders_.empty()) throw std::logic_error("Metrics: set_shards() once, before the electors");
  for (int k = 0; k < shards; ++k) {
    const std::map<std::string, std::string> labels =
        shards == 1 ? std::map<std::string, std::string>{}
                    : std::map<std::string, std::string>{{"shard", std::to_string(k)}};
    leaders_.push_back(&leader_family_.Add(labels));
    epochs_.push_back(&epoch_family_.Add(labels));
    shard_observers_.push_back(std::make_unique<ShardObserver>(*this, k));
  }
  live_->set_shards(shards);
}

detail::LeaderObserver* Metrics::shard_observer(int shard) {
  if (leaders_.size() <= 1) return this;
  return shard_observers_.at(static_cast<std::size_t>(shard)).get();
}

void Metrics::shard_granted(int shard, std::int64_t epoch, double failover_seconds) {
  leaders_.at(static_cast<std::size_t>(shard))->Set(1);
  shards_led_.Increment();
  live_->lease_renewed(shard);
  if (failover_seconds >= 0) last_failover_.Set(failover_seconds);
  epochs_.at(static_cast<std::size_t>(shard))->Set(static_cast<double>(epoch));
  leadership_changes_.Add({{"event", "granted"}, {"reason", "elected"}}).Increment();
}

void Metrics::shard_revoked(int shard, std::int64_t, std::string_view reason) {
  leaders_.at(static_cast<std::size_t>(shard))->Set(0);
  shards_led_.Decrement();
  live_->lease_lost(shard);
  leadership_changes_.Add({{"event", "revoked"}, {"reason", std::string(reason)}}).Increment();
}

void Metrics::granted(std::int64_t epoch, double failover_seconds) {
  shard_granted(0, epoch, failover_seconds);
}

void Metrics::revoked(std::int64_t epoch, std::string_view reason) {
  shard_revoked(0, epoch, reason);
}

void Metrics::renewed() {
  live_->lease_renewed(0);
}

void Metrics::renewal_took(double seconds) {
  renewal_seconds_.Observe(seconds);
}

void Metrics::renewal_failed() {
  renewal_failures_.Increment();
}

void Metrics::evicted_holder() {
  evictions_.Increment();
}

void Metrics::stranger_holds_lock(bool holds) {
  stranger_.Set(holds ? 1 : 0);
}

}  // namespace baton::metrics
