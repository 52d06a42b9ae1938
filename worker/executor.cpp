// Executor: handler runs on the asio pool, with outcome classification (see executor.h).
#include "worker/executor.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "baton/detail/call_watch.h"
#include "baton/detail/text.h"

namespace baton::worker {
namespace {

using Clock = std::chrono::steady_clock;

// The longest retry delay (100 years, as the SQL API's delay limit) and error message stored.
constexpr std::int64_t kMaxDelayMs = 3'153'600'000'000;
constexpr std::size_t kMaxErrorBytes = 4000;
// How long a pool thread asks what became of a COMMIT that lost its answer.
constexpr auto kCommitDoubtWait = std::chrono::seconds(10);

// Each pool thread's own generator for retry jitter.
std::mt19937_64& thread_rng() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng;
}
// Each pool thread keeps its own connection for transactional handlers (a pool thread belongs to
// one executor for its whole life, so the options never change under it).
thread_local std::unique_ptr<pqxx::connection> tl_conn;

}  // namespace

namespace {

// The handlers' sessions: a statement or an open transaction is bounded (5 minutes), so that a
// deposed leader's handler cannot hold rows for long.
ExecutorConfig with_session(ExecutorConfig config) {
  if (config.connect.statement_timeout_ms == 0) config.connect.statement_timeout_ms = 300'000;
  if (config.connect.idle_in_transaction_timeout_ms == 0) {
    config.connect.idle_in_transaction_timeout_ms = 300'000;
  }
  // Through a pooler the settings go with each transaction instead (local_settings).
  config.connect.session_settings = !config.pooled;
  return config;
}

// Through a transaction pooler a session's settings do not follow the transactions; the same
// settings, for one transaction.
std::string local_settings(const ExecutorConfig& c) {
  if (!c.pooled) return "";
  detail::validate_schema_name(c.connect.schema);
  return "SET LOCAL search_path TO \"" + c.connect.schema +
         "\"; SET LOCAL statement_timeout = " + std::to_string(c.connect.statement_timeout_ms) +
         "; SET LOCAL idle_in_transaction_session_timeout = " +
         std::to_string(c.connect.idle_in_transaction_timeout_ms);
}

}  // namespace

Executor::EpochRuns::~EpochRuns() {
  detail::CallWatch::instance().end_abort(detail::owner_of(this));
}

Executor::Executor(ExecutorConfig config, const detail::HandlerRegistry& handlers,
                   Completer& completer, detail::JobObserver* observer,
                   std::function<void()> on_slot_free,
                   std::function<bool(std::int64_t)> lease_valid)
    : config_(with_session(std::move(config))),
      local_settings_(local_settings(config_)),
      handlers_(handlers),
      completer_(completer),
      observer_(observer),
      lease_valid_(std::move(lease_valid)),
      on_slot_free_(std::move(on_slot_free)),
      cores_(static_cast<int>(std::max(1U, std::thread::hardware_concurrency()))),
      pool_(std::make_unique<boost::asio::thread_pool>(config_.threads)),
      stall_timer_(pool_->get_executor()) {}

namespace {

// This thread's CPU time and how often it gave up the CPU to wait (I/O, a sleep, a lock).
struct ThreadUsage {
  double cpu_seconds = 0;
  long waits = 0;
};
ThreadUsage thread_usage() {
  ThreadUsage u;
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  u.cpu_seconds = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  rusage ru{};
  if (getrusage(RUSAGE_THREAD, &ru) == 0) u.waits = ru.ru_nvcsw;
  return u;
}

// The share of a run's wall time that needed a core. A run that never waited was CPU all along,
// whatever the wall clock says (other threads took the cores meanwhile): 1.
double cpu_share(const ThreadUsage& before, const ThreadUsage& after, double wall_seconds) {
  if (after.waits == before.waits || wall_seconds <= 0) return 1.0;
  return std::clamp((after.cpu_seconds - before.cpu_seconds) / wall_seconds, 0.0, 1.0);
}

}  // namespace

int Executor::concurrency() const {
  const double share = mean_cpu_share_.load(std::memory_order_relaxed);
  if (share <= 0) return config_.threads;
  const double want = std::round(cores_ / std::max(share, 1e-3));
  const int low = std::min(config_.threads, cores_);
  return std::clamp(static_cast<int>(std::min<double>(want, config_.threads)), low,
                    config_.threads);
}

int Executor::limit() const {
  return stalled_.load(std::memory_order_relaxed) ? config_.threads : concurrency();
}

Executor::~Executor() {
  {
    std::lock_guard lock(ready_mutex_);
    closing_ = true;  // a check that fires meanwhile arms no other
    stall_timer_.cancel();
  }
  if (pool_) pool_->join();
}

std::shared_ptr<Executor::EpochRuns> Executor::epoch_runs(std::int64_t epoch) {
  // Under runs_mutex_. Epochs whose runs are all gone are forgotten.
  std::erase_if(epochs_, [](const auto& e) { return e->ended.load() && e.use_count() == 1; });
  for (const auto& e : epochs_) {
    if (e->epoch == epoch && !e->ended.load()) return e;
  }
  auto e = std::make_shared<EpochRuns>();
  e->epoch = epoch;
  epochs_.push_back(e);
  return e;
}

void Executor::accept(std::int64_t epoch) {
  std::lock_guard lock(runs_mutex_);
  epoch_runs(epoch)->accepted.store(true);
}

void Executor::stop_accepting(std::int64_t epoch) {
  {
    std::lock_guard lock(runs_mutex_);
    for (const auto& e : epochs_) {
      if (epoch == 0 || e->epoch == epoch) e->accepted.store(false);
    }
  }
  release_unstartable();
}

void Executor::end_epoch(std::int64_t epoch) {
  {
    std::lock_guard lock(runs_mutex_);
    for (const auto& e : epochs_) {
      if ((epoch == 0 || e->epoch == epoch) && !e->ended.exchange(true)) {
        // Transactional handlers waiting on the database are cut: their commits would be fenced.
        detail::CallWatch::instance().abort(detail::owner_of(e.get()));
      }
    }
  }
  release_unstartable();
}

void Executor::release_unstartable() {
  std::vector<std::shared_ptr<Run>> out;
  {
    std::lock_guard lock(ready_mutex_);
    for (auto it = ready_.begin(); it != ready_.end();) {
      const auto& runs = it->second;
      const auto& e = runs.front()->epoch;
      if (e->accepted.load() && !e->ended.load()) {
        ++it;
        continue;
      }
      queued_ -= static_cast<int>(runs.size());
      out.insert(out.end(), std::make_move_iterator(it->second.begin()),
                 std::make_move_iterator(it->second.end()));
      it = ready_.erase(it);
    }
  }
  // start() sees that they may not start, and releases them.
  for (const auto& run : out)
    start(run);
}

void Executor::cancel_job(std::int64_t id) {
  std::lock_guard lock(runs_mutex_);
  auto [from, to] = runs_.equal_range(id);
  for (auto it = from; it != to; ++it)
    it->second->cancel_asked.store(true);
}

std::vector<std::int64_t> Executor::running_ids() const {
  std::lock_guard lock(runs_mutex_);
  std::vector<std::int64_t> ids;
  ids.reserve(runs_.size());
  for (const auto& [id, run] : runs_)
    ids.push_back(id);
  return ids;
}

int Executor::busy_in(const std::string& queue) const {
  std::lock_guard lock(runs_mutex_);
  auto it = queue_busy_.find(queue);
  return it == queue_busy_.end() ? 0 : it->second;
}

int Executor::in_flight(std::int64_t epoch) const {
  std::lock_guard lock(runs_mutex_);
  for (const auto& e : epochs_) {
    if (e->epoch == epoch && !e->ended.load()) return e->in_flight.load();
  }
  return 0;
}

int Executor::accepted_epochs() const {
  std::lock_guard lock(runs_mutex_);
  return static_cast<int>(std::count_if(epochs_.begin(), epochs_.end(), [](const auto& e) {
    return e->accepted.load() && !e->ended.load();
  }));
}

void Executor::submit(detail::ClaimedJob job) {
  std::vector<detail::ClaimedJob> jobs;
  jobs.push_back(std::move(job));
  submit(std::move(jobs));
}

void Executor::submit(std::vector<detail::ClaimedJob> jobs, Kept* keep) {
  if (jobs.empty()) return;
  const int n = static_cast<int>(jobs.size());
  const int busy = busy_.fetch_add(n) + n;
  const int waiting = waiting_.fetch_add(n) + n;
  if (observer_ != nullptr) observer_->claimed_waiting(waiting);
  std::vector<std::shared_ptr<Run>> runs;
  runs.reserve(jobs.size());
  {
    std::lock_guard lock(runs_mutex_);
    std::shared_ptr<EpochRuns> epoch;
    for (auto& job : jobs) {
      auto run = std::make_shared<Run>();
      if (!epoch || epoch->epoch != job.job.epoch) epoch = epoch_runs(job.job.epoch);
      run->epoch = epoch;
      run->epoch->in_flight.fetch_add(1);
      run->cancel_asked.store(job.cancel_requested);
      ++queue_busy_[job.job.queue];
      run->claimed = std::move(job);
      runs_.emplace(run->claimed.job.id, run);
      runs.push_back(std::move(run));
    }
  }
  if (observer_ != nullptr) observer_->pool_busy(busy, config_.threads, limit());
  // Kept for the caller as a runner's place: it counts against the limit as a runner would.
  if (keep != nullptr) {
    const auto* entry = handlers_.find(runs.front()->claimed.job.type);
    if (entry == nullptr || entry->transactional) keep = nullptr;
  }
  int spawn = 0;
  {
    std::lock_guard lock(ready_mutex_);
    if (keep != nullptr && runners_ < limit()) {
      keep->run_ = std::move(runs.front());
      ++runners_;
      ++starts_;
    }
    for (auto& run : runs) {
      if (!run) continue;
      const auto epoch = run->claimed.job.epoch;
      ready_[epoch].push_back(std::move(run));
    }
    queued_ += keep != nullptr && *keep ? n - 1 : n;
    spawn = spawn_locked();
  }
  post_runners(spawn);
}

void Executor::run_kept(Kept kept, bool release) {
  if (!kept) return;
  // With shards, the other lanes' pollers may wait for the place this job frees.
  start(kept.run_, accepted_epochs() > 1, release);
  kept.run_.reset();
  int spawn = 0;
  {
    std::lock_guard lock(ready_mutex_);
    --runners_;
    spawn = spawn_locked();
  }
  post_runners(spawn);
}

int Executor::spawn_locked() {
  const int spawn = std::max(0, std::min(limit() - runners_, queued_));
  runners_ += spawn;
  if (queued_ > spawn) arm_stall_check_locked();
  return spawn;
}

void Executor::post_runners(int count) {
  for (int i = 0; i < count; ++i)
    boost::asio::post(*pool_, [this] { runner(); });
}

void Executor::runner() {
  for (;;) {
    std::shared_ptr<Run> run;
    int spawn = 0;
    {
      std::lock_guard lock(ready_mutex_);
      // The stall check runs on a pool thread; once a stall lets every thread take a job, every
      // thread may be a runner that never goes back to the pool while jobs wait, and the check
      // would not run until the queue is empty. So the runners end the stall themselves when the
      // check is due and jobs have started since it was armed (what the check would find).
      if (stalled_ && starts_ != checked_starts_ && Clock::now() >= stall_check_due_)
        stalled_ = false;
      if (queued_ == 0 || runners_ > limit()) {
        --runners_;
        if (queued_ == 0) stalled_ = false;
        return;
      }
      run = next_ready_locked();
      ++starts_;
      // Jobs that wait rather than compute raise the limit as they run: more runners then.
      spawn = spawn_locked();
    }
    post_runners(spawn);
    start(run);
  }
}

void Executor::arm_stall_check_locked() {
  if (stall_check_armed_ || closing_) return;
  stall_check_armed_ = true;
  checked_starts_ = starts_;
  stall_check_due_ = Clock::now() + std::chrono::seconds(1);
  stall_timer_.expires_at(stall_check_due_);
  stall_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) stall_check();
  });
}

void Executor::stall_check() {
  int spawn = 0;
  {
    std::lock_guard lock(ready_mutex_);
    stall_check_armed_ = false;
    if (queued_ == 0) return;
    if (starts_ == checked_starts_) {
      if (!stalled_) {
        // Every runner is in a job that has not ended for a second, and jobs wait: they may be
        // waiting for each other. Let every thread take one.
        stalled_ = true;
        spdlog::debug("executor: no job started for 1s with {} waiting; up to {} run at once",
                      queued_, config_.threads);
      }
    } else if (stalled_) {
      // Jobs start again: back to the adapted limit (the runners above it retire as their jobs
      // end), so that a backlog behind a stall does not keep every thread busy on CPU-bound work.
      stalled_ = false;
    }
    spawn = spawn_locked();
    arm_stall_check_locked();
  }
  post_runners(spawn);
}

std::shared_ptr<Executor::Run> Executor::next_ready_locked() {
  auto it = ready_.upper_bound(last_epoch_);
  if (it == ready_.end()) it = ready_.begin();
  auto run = std::move(it->second.front());
  it->second.pop_front();
  last_epoch_ = it->first;
  if (it->second.empty()) ready_.erase(it);
  --queued_;
  return run;
}

void Executor::start(const std::shared_ptr<Run>& run, bool wake_poller, bool release) {
  const auto& claimed = run->claimed;
  const auto epoch = claimed.job.epoch;
  // The lease is checked at this instant: after a pause (SIGSTOP, a suspended VM) the steady
  // clock says whether the claim's epoch is still ours, whatever the revoke event has reached.
  auto may_start = [&] {
    return !release && run->epoch->accepted.load() && !run->epoch->ended.load() &&
           (!lease_valid_ || lease_valid_(epoch));
  };
  const int still_waiting = waiting_.fetch_sub(1) - 1;
  if (observer_ != nullptr) observer_->claimed_waiting(still_waiting);
  // Read before the check: a run let start has a started_at() inside its lease, however long
  // the node pauses between here and its handler.
  const auto allowed_at = std::chrono::system_clock::now();
  if (may_start()) {
    if (observer_ != nullptr) {
      const double held = std::chrono::duration<double>(Clock::now() - claimed.claimed).count();
      observer_->job_started(claimed.job.queue, claimed.job.type, claimed.wait_seconds + held);
    }
    const auto started = Clock::now();
    // Runs of a millisecond or more are measured (two system calls each side), and one in 8 of
    // shorter ones.
    const bool sample = mean_run_seconds_.load(std::memory_order_relaxed) >= 1e-3 ||
                        (samples_.fetch_add(1, std::memory_order_relaxed) % 8) == 0;
    const ThreadUsage before = sample ? thread_usage() : ThreadUsage{};
    this->run(*run, allowed_at);
    const double took = std::chrono::duration<double>(Clock::now() - started).count();
    const double mean = mean_run_seconds_.load(std::memory_order_relaxed);
    mean_run_seconds_.store(mean == 0 ? took : mean + (took - mean) / 16,
                            std::memory_order_relaxed);
    if (sample) {
      const double share = cpu_share(before, thread_usage(), took);
      const double was = mean_cpu_share_.load(std::memory_order_relaxed);
      mean_cpu_share_.store(was == 0 ? share : was + (share - was) / 8, std::memory_order_relaxed);
    }
  } else {
    completer_.add(detail::Release{claimed.job.id, epoch, claimed.token, claimed.partitioned,
                                   claimed.job.queue, claimed.cluster_limited});
  }
  {
    std::lock_guard lock(runs_mutex_);
    if (--queue_busy_[claimed.job.queue] == 0) queue_busy_.erase(claimed.job.queue);
    run->epoch->in_flight.fetch_sub(1);
    auto [from, to] = runs_.equal_range(claimed.job.id);
    for (auto it = from; it != to; ++it) {
      if (it->second == run) {
        runs_.erase(it);
        break;
      }
    }
  }
  const int now_busy = busy_.fetch_sub(1) - 1;
  if (observer_ != nullptr) observer_->pool_busy(now_busy, config_.threads, limit());
  if (now_busy == 0) {
    std::lock_guard lock(idle_mutex_);
    idle_cv_.notify_all();
  }
  if (!wake_poller || waiting_.load() > refill_mark_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(slot_free_mutex_);
  if (on_slot_free_) on_slot_free_();
}

bool Executor::wait_epoch_idle(std::int64_t epoch, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  auto idle = [&] {
    std::lock_guard lock(runs_mutex_);
    return std::none_of(runs_.begin(), runs_.end(),
                        [&](const auto& r) { return r.second->epoch->epoch == epoch; });
  };
  // Checked every few milliseconds (a drain is rare; the runs' ends stay free of it).
  while (!idle()) {
    if (Clock::now() >= deadline) return false;
    std::unique_lock lock(idle_mutex_);
    idle_cv_.wait_for(lock, Millis(5));
  }
  return true;
}

bool Executor::wait_idle(Millis timeout) {
  std::unique_lock lock(idle_mutex_);
  return idle_cv_.wait_for(lock, timeout, [this] { return busy_.load() == 0; });
}

void Executor::detach_slot_free() {
  std::lock_guard lock(slot_free_mutex_);
  on_slot_free_ = nullptr;
}

bool Executor::run_transactional(const detail::HandlerEntry& entry, JobContext& ctx, const Run& run,
                                 double& run_seconds) {
  const detail::ClaimedJob& claimed = run.claimed;
  const auto started = Clock::now();
  try {
    std::optional<detail::CallWatch::Armed> armed;
    std::optional<pqxx::work> tx;
    // A session the server ended while this thread's connection sat idle (a restart, a
    // failover) is found by the transaction's first statement, before the handler runs: that
    // connects again once instead of failing the job's attempt.
    for (int tries = 1; !tx; ++tries) {
      // Closed by an earlier job whose failure said something else: a handler that caught the
      // connection's error and threw its own, a fenced run's rollback (which swallows it).
      if (tl_conn && !tl_conn->is_open()) tl_conn.reset();
      if (!tl_conn) tl_conn = detail::connect(config_.connect);
      // Cut when the epoch ends (and the run is then fenced), however long the handler takes.
      armed.emplace(detail::CallWatch::instance().arm(*tl_conn, Clock::time_point::max(),
                                                      detail::owner_of(run.epoch.get())));
      try {
        tx.emplace(*tl_conn);
        if (!local_settings_.empty()) tx->exec(local_settings_);
      } catch (const std::exception& e) {
        tx.reset();
        armed.reset();
        if (tries > 1 || !detail::is_connection_error(e) || run.epoch->ended.load()) throw;
        tl_conn.reset();
        if (observer_ != nullptr) observer_->database_error("executor");
        spdlog::info(
            "a pool thread's database connection was gone ({}); connecting again for "
            "job={} before its handler starts",
            detail::failure_text(e), ctx.job().id);
      }
    }
    entry.transactional(ctx, *tx);
    if (Clock::now() > ctx.deadline()) throw std::runtime_error("timeout: ran past its limit");
    run_seconds = std::chrono::duration<double>(Clock::now() - started).count();
    const Job& job = ctx.job();
    std::string xid;
    if (!detail::complete_in(
            *tx, {job.id, job.epoch, claimed.token, run_seconds, job.queue, job.type}, &xid)) {
      tx->abort();
      spdlog::warn(
          "job FENCED: job={} queue={} type={} epoch={}: a newer epoch owns it; the "
          "handler's writes were rolled back",
          job.id, job.queue, job.type, job.epoch);
      if (observer_ != nullptr) observer_->jobs_fenced(job.queue, job.type, 1);
      return false;
    }
    // Its place, free once this commits, may be taken on another node (as the completer wakes
    // them for other outcomes).
    if (claimed.cluster_limited)
      detail::wake_limited_queues(*tx, config_.connect.schema, {job.queue});
    try {
      tx->commit();
    } catch (const pqxx::in_doubt_error&) {
      // The transaction and the call watch refer to the connection: they go first.
      tx.reset();
      armed.reset();
      tl_conn.reset();
      if (observer_ != nullptr) observer_->database_error("executor");
      const std::string status = commit_status(xid, run);
      if (status != "committed") {
        throw pqxx::broken_connection(
            "the connection was lost as the job's COMMIT ran, and the server says " + status);
      }
    }
    return true;
  } catch (const std::exception& e) {
    if (detail::is_connection_error(e)) tl_conn.reset();
    throw;
  }
}

std::string Executor::commit_status(const std::string& xid, const Run& run) {
  // The server ends the transaction when it sees the client gone (at once, or by the session's
  // idle timeouts): until then it is "in progress". Asked on a new connection, for a bounded
  // time, as this pool thread waits; the end of the epoch cuts the wait (the outcome is then
  // fenced either way).
  const Job& job = run.claimed.job;
  const auto owner = detail::owner_of(run.epoch.get());
  const auto deadline = Clock::now() + kCommitDoubtWait;
  std::string status = "unknown";
  for (int tries = 0; tries < 100 && Clock::now() < deadline && !run.epoch->ended.load(); ++tries) {
    try {
      auto conn = detail::connect(config_.connect, owner);
      auto armed = detail::CallWatch::instance().arm(*conn, deadline, owner);
      status = detail::transaction_status(*conn, xid);
    } catch (const std::exception& e) {
      status = "unknown (" + detail::failure_text(e) + ")";
    }
    if (status != "in progress" && !status.starts_with("unknown (")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  spdlog::warn(
      "the COMMIT of job={} queue={} type={} lost its answer (the connection was lost as it "
      "ran); {}",
      job.id, job.queue, job.type,
      status == "committed"
          ? std::string("the server says it committed: the job is done")
          : "the server says " + status +
                ": the attempt counts as failed (its outcome matches only its own claim, so "
                "nothing is written twice)");
  return status;
}

void Executor::run(Run& run, std::chrono::system_clock::time_point allowed_at) {
  const detail::ClaimedJob& claimed = run.claimed;
  const Job& job = claimed.job;
  const auto started = Clock::now();
  const auto deadline = claimed.timeout_ms > 0
                            ? started + std::chrono::milliseconds(claimed.timeout_ms)
                            : Clock::time_point::max();
  std::string error;
  std::string dead_reason;  // non-empty: never retry
  bool recorded = false;    // a transactional handler completed (or was fenced) by itself
  std::optional<std::chrono::milliseconds> retry_in;  // the handler chose the delay
  const detail::HandlerEntry* entry = handlers_.find(job.type);
  double run_seconds = 0;
  if (entry == nullptr) {
    // The claim takes only the types this node handles, so this is a node whose registry
    // changed under it: leave the job for a node that knows it.
    spdlog::error("no handler for job={} type={} on this node: released", job.id, job.type);
    completer_.add(detail::Release{job.id, job.epoch, claimed.token, claimed.partitioned, job.queue,
                                   claimed.cluster_limited});
    return;
  }
  if (run.cancel_asked.load()) {
    // Cancelled between its claim and its start: it never runs.
    completer_.add(detail::Failure{job.id, job.epoch, claimed.token, job.attempt,
                                   "cancelled before it started", false, "", 0, job.queue, job.type,
                                   claimed.partitioned, claimed.cluster_limited});
    return;
  }
  try {
    JobContext ctx(job, deadline, run.epoch->ended, run.cancel_asked, allowed_at);
    if (entry->transactional) {
      const bool committed = run_transactional(*entry, ctx, run, run_seconds);
      recorded = true;
      if (committed && observer_ != nullptr) {
        observer_->job_finished(job.queue, job.type, detail::Outcome::completed, run_seconds,
                                claimed.since_enqueue_seconds + run_seconds);
      }
    } else {
      entry->plain(ctx);
      if (Clock::now() > deadline) {
        error = "timeout: ran past its " + std::to_string(claimed.timeout_ms) + "ms limit";
      }
    }
  } catch (const PayloadError& e) {
    error = e.what();
    dead_reason = "bad_payload";
  } catch (const Discard& e) {
    error = e.what();
    dead_reason = "discarded";
  } catch (const RetryIn& e) {
    error = e.what();
    if (error.empty()) error = "asked to retry";
    retry_in = e.delay();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "handler threw an exception with an empty message";
  } catch (...) {
    error = "handler threw something that is not a std::exception";
  }
  if (recorded && error.empty()) return;
  run_seconds = std::chrono::duration<double>(Clock::now() - started).count();

  if (error.empty()) {
    completer_.add(detail::Completion{job.id, job.epoch, claimed.token, run_seconds, job.queue,
                                      job.type, claimed.partitioned, claimed.cluster_limited});
    if (observer_ != nullptr) {
      observer_->job_finished(job.queue, job.type, detail::Outcome::completed, run_seconds,
                              claimed.since_enqueue_seconds + run_seconds);
    }
    return;
  }
  // Whatever the handler threw is stored as text PostgreSQL accepts (valid UTF-8, no NUL).
  error = detail::clean_text(error, kMaxErrorBytes);
  const bool exhausted = job.attempt >= job.max_attempts;
  if (dead_reason.empty() && exhausted) dead_reason = "exhausted";
  detail::Failure f{job.id,      job.epoch, claimed.token, job.attempt, error, !dead_reason.empty(),
                    dead_reason, 0,         job.queue,     job.type};
  f.partitioned = claimed.partitioned;
  f.cluster_limited = claimed.cluster_limited;
  if (!f.dead) {
    const auto& policy = entry->retry ? *entry->retry : config_.retry;
    // RetryIn takes any duration; the database takes up to the longest delay an enqueue may ask.
    f.retry_delay_ms = retry_in ? std::clamp<std::int64_t>(retry_in->count(), 0, kMaxDelayMs)
                                : policy.delay(job.attempt, thread_rng()).count();
  }
  const bool cancelled = run.cancel_asked.load();
  spdlog::warn("job failed: job={} queue={} type={} epoch={} attempt={}/{} {}: {}", job.id,
               job.queue, job.type, job.epoch, job.attempt, job.max_attempts,
               cancelled ? std::string("cancelled")
               : f.dead  ? "dead (" + dead_reason + ")"
                         : "retry in " + std::to_string(f.retry_delay_ms) + "ms",
               detail::one_line(error));
  completer_.add(std::move(f));
  if (observer_ != nullptr) {
    observer_->job_finished(job.queue, job.type,
                            dead_reason.empty() ? detail::Outcome::retried : detail::Outcome::dead,
                            run_seconds, claimed.since_enqueue_seconds + run_seconds);
  }
}

}  // namespace baton::worker
