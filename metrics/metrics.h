// Metrics: baton's Prometheus families, and the node's HTTP endpoint (/metrics, /healthz,
// /readyz). It implements the observer interfaces that worker/ and leader/ report through.
//
// Thread-safety: every member is safe to call from any thread (prometheus-cpp metrics are atomic;
// label lookups and the depth picture are guarded by a mutex).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "baton/detail/observer.h"
#include "metrics/http_server.h"

namespace baton::metrics {

class Metrics final : public detail::JobObserver,
                      public detail::LeaderObserver,
                      public detail::QueueObserver,
                      public detail::ScheduleObserver {
 public:
  // `deployment` labels every sample (NodeConfig::deployment()); `shards` is the deployment's
  // shard count (see set_shards()).
  Metrics(const std::string& node_id, std::string deployment, int shards = 1);
  ~Metrics() override;

  // Serves /metrics, /healthz and /readyz on host:port (port 0 picks one). Throws
  // std::runtime_error with the address when it cannot bind.
  void serve(const std::string& listen, HttpServer::Readiness ready,
             std::vector<detail::http::Route> extra = {});
  // host:port actually bound, empty when not serving.
  std::string address() const { return server_ ? server_->address() : std::string(); }

  // ErrorObserver
  void database_error(std::string_view component) override;
  void authentication_failed() override;

  // The console answered a request: `kind` is page, read or action; `status` its HTTP status.
  void console_request(std::string_view kind, int status);

  // JobObserver
  void job_started(std::string_view queue, std::string_view type, double wait_seconds) override;
  void job_finished(std::string_view queue, std::string_view type, detail::Outcome outcome,
                    double run_seconds, double total_seconds) override;
  void jobs_fenced(std::string_view queue, std::string_view type, std::size_t count) override;
  void jobs_released(std::size_t count) override;
  void pool_busy(int busy, int threads, int concurrency) override;
  void claimed_waiting(int count) override;
  void completer_pending(std::size_t count) override;
  void claim_took(double seconds, bool found_jobs) override;
  void claim_cut(detail::ClaimCut reason) override;
  void claim_gathered(double seconds) override;

  // QueueObserver
  void queue_depths(const std::vector<detail::QueueDepth>& depths) override;
  void queue_depths_cleared() override;
  void unhandled_jobs(const std::vector<detail::UnhandledJobs>& jobs) override;

  // ScheduleObserver
  void tick_enqueued(std::string_view schedule, double lag_seconds) override;

  // Shards (docs/concepts.md): with one, baton_leader and baton_leader_epoch have no shard label
  // and the elector reports to this object. With more, every shard's elector reports through
  // shard_observer(k), and both carry shard="k".
  static constexpr int kMaxShards = 64;
  detail::LeaderObserver* shard_observer(int shard);

  // LeaderObserver (shard 0's, or the one leadership without shards)
  void granted(std::int64_t epoch, double failover_seconds) override;
  void revoked(std::int64_t epoch, std::string_view reason) override;
  void renewed() override;
  void renewal_took(double seconds) override;
  void renewal_failed() override;
  void evicted_holder() override;
  void stranger_holds_lock(bool holds) override;

 private:
  struct JobSeries {
    prometheus::Counter* started;
    prometheus::Counter* completed;
    prometheus::Counter* failed;
    prometheus::Counter* retried;
    prometheus::Counter* dead;
    prometheus::Histogram* wait;
    prometheus::Histogram* run;
    prometheus::Histogram* total;
  };
  JobSeries& series(std::string_view queue, std::string_view type);
  class Live;  // values computed at scrape time
  class ShardObserver;
  void set_shards(int shards);  // from the constructor
  void shard_granted(int shard, std::int64_t epoch, double failover_seconds);
  void shard_revoked(int shard, std::int64_t epoch, std::string_view reason);

  const std::string deployment_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> process_;
  std::shared_ptr<Live> live_;
  std::unique_ptr<HttpServer> server_;

  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& completed_;
  prometheus::Family<prometheus::Counter>& failed_;
  prometheus::Family<prometheus::Counter>& retried_;
  prometheus::Family<prometheus::Counter>& dead_;
  prometheus::Family<prometheus::Histogram>& wait_;
  prometheus::Family<prometheus::Histogram>& run_;
  prometheus::Family<prometheus::Histogram>& total_;
  prometheus::Family<prometheus::Counter>& leadership_changes_;
  prometheus::Family<prometheus::Counter>& db_errors_;
  prometheus::Counter& auth_failures_;
  prometheus::Family<prometheus::Counter>& console_requests_;
  prometheus::Family<prometheus::Gauge>& leader_family_;
  prometheus::Family<prometheus::Gauge>& epoch_family_;
  prometheus::Gauge& shards_led_;
  // By shard, from set_shards() (guarded by mutex_ while it runs; read-only after).
  std::vector<prometheus::Gauge*> leaders_;
  std::vector<prometheus::Gauge*> epochs_;
  std::vector<std::unique_ptr<ShardObserver>> shard_observers_;
  prometheus::Gauge& last_failover_;
  prometheus::Family<prometheus::Counter>& fenced_;
  prometheus::Counter& released_;
  prometheus::Counter& renewal_failures_;
  prometheus::Histogram& renewal_seconds_;
  prometheus::Counter& evictions_;
  prometheus::Gauge& stranger_;
  prometheus::Gauge& pool_threads_;
  prometheus::Gauge& pool_concurrency_;
  prometheus::Gauge& pool_busy_;
  prometheus::Gauge& claimed_waiting_;
  prometheus::Gauge& completer_pending_;
  prometheus::Family<prometheus::Histogram>& claim_seconds_;
  prometheus::Histogram& claims_with_jobs_;
  prometheus::Histogram& claims_empty_;
  prometheus::Family<prometheus::Counter>& claims_cut_;
  prometheus::Counter& cut_row_locked_;
  prometheus::Counter& cut_lease_end_;
  prometheus::Counter& cut_statement_timeout_;
  prometheus::Counter& claim_gathers_;
  prometheus::Counter& claim_gather_seconds_;
  prometheus::Family<prometheus::Gauge>& depth_;
  prometheus::Family<prometheus::Gauge>& oldest_;
  prometheus::Family<prometheus::Gauge>& dead_jobs_;
  prometheus::Family<prometheus::Gauge>& unhandled_;
  prometheus::Family<prometheus::Gauge>& unhandled_oldest_;
  prometheus::Family<prometheus::Gauge>& schedule_lag_;
  prometheus::Family<prometheus::Counter>& schedule_ticks_;

  std::mutex mutex_;  // guards series_, sampled_queues_ and unhandled_kinds_
  std::unordered_map<std::string, JobSeries> series_;
  std::set<std::string> sampled_queues_;
  std::set<std::pair<std::string, std::string>> unhandled_kinds_;  // (queue, type) reported
};

}  // namespace baton::metrics
