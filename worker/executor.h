// Executor: runs handlers on a boost::asio::thread_pool of a fixed size and turns each run into
// an outcome for the completer. How many run at once adapts to the jobs: handlers that keep a
// thread's CPU busy (no-op and compute jobs) run about one per core, since more only contend for
// the cores; handlers that wait (I/O, sleeps) run up to every thread. The share of a run's wall
// time that needed a core (all of it for a run that never waited, however long other threads
// kept it off the CPU), averaged over recent runs, sets it: cores / share, between
// min(threads, cores) and threads.
//
// Submitted jobs wait in the executor's own queue; that many "runners" (pool tasks) take them one
// after another, so a busy pool starts job after job without a thread handing each to the next
// (a thread switch per job cost more than a no-op job). When no job has started for a second
// while jobs wait, every thread may take one (until a second in which jobs started again), so
// jobs that wait for each other cannot deadlock below the thread count. The poller keeps the queue
// short (see poller.h). A job starts only while the executor accepts its epoch AND the lease of
// that epoch is valid at that instant: jobs that cannot start (leadership ended, a graceful
// shutdown began, or the lease ran out while they waited) are released back to the queue through
// the completer instead; those of an epoch no longer accepted are released at once, without waiting
// for a runner.
//
// A job the poller keeps (submit() with `keep`) runs on the poller's claiming thread instead of a
// runner, in a runner's place: an idle job then starts without a pool thread being woken.
//
// Cancellation is per epoch and per job: when an epoch ends, every run of that epoch sees
// cancelled() (and a later epoch of the same node never clears it); a job cancelled by a producer
// sees it too, and its outcome is recorded as cancelled.
//
// Thread-safety: submit() from the poller thread; every other member from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/observer.h"
#include "baton/detail/registry.h"
#include "baton/detail/retry_policy.h"
#include "worker/completer.h"

namespace baton::worker {

struct ExecutorConfig {
  detail::ConnectOptions connect;  // for transactional handlers' connections, one per thread
  // The handlers' connections may go through a transaction pooler (the node was given a
  // separate election URL): their session settings are repeated in every transaction.
  bool pooled = false;
  int threads = 16;
  std::string node_id;
  detail::RetryPolicy retry;
};

class Executor {
  struct Run;  // one submitted job (below)

 public:
  // `lease_valid(epoch)` is the elector's lease check, asked as each job starts.
  Executor(ExecutorConfig config, const detail::HandlerRegistry& handlers, Completer& completer,
           detail::JobObserver* observer, std::function<void()> on_slot_free,
           std::function<bool(std::int64_t)> lease_valid = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  int threads() const { return config_.threads; }
  // How many jobs may run at once now (see above).
  int concurrency() const;
  // How many may run now: concurrency(), or every thread while the queue is stalled (see above).
  int limit() const;
  // concurrency() minus submitted jobs (running or waiting); negative while jobs wait.
  int free_slots() const { return concurrency() - busy_.load(); }
  // Submitted jobs that wait for a thread.
  int waiting() const { return waiting_.load(); }
  // Moving average of how long a handler runs, in seconds; 0 until one has run.
  double mean_run_seconds() const { return mean_run_seconds_.load(std::memory_order_relaxed); }
  // A finished job wakes the poller (on_slot_free) only when at most `mark` jobs still wait.
  void set_refill_mark(int mark) { refill_mark_.store(mark, std::memory_order_relaxed); }
  // Jobs of `epoch` may start (while its lease is valid); jobs of epochs not accepted are
  // released. A node that leads several shards accepts each shard's epoch (epochs are unique
  // across shards).
  void accept(std::int64_t epoch);
  // No job of `epoch` (0: of any epoch) starts any more; those waiting are released. Runs go on.
  void stop_accepting(std::int64_t epoch = 0);
  // The runs of `epoch` see cancelled() from now on (0: the runs of every epoch, for shutdown).
  void end_epoch(std::int64_t epoch);
  // The run of job `id`, if this node runs it, sees cancelled() and cancel_requested().
  void cancel_job(std::int64_t id);
  // Ids of the jobs submitted and not finished (running or waiting for a thread).
  std::vector<std::int64_t> running_ids() const;
  // Jobs of `queue` running now.
  int busy_in(const std::string& queue) const;
  // With shards: jobs of `epoch` submitted and not finished, and how many epochs may start jobs
  // now (the shards this node leads).
  int in_flight(std::int64_t epoch) const;
  int accepted_epochs() const;
  // A job submitted to start on the thread that submitted it (run_kept()).
  class Kept {
   public:
    explicit operator bool() const { return run_ != nullptr; }

   private:
    friend class Executor;
    std::shared_ptr<Run> run_;
  };
  // Queues the jobs (a claim's, in claim order) to start on the pool. The caller made sure
  // there is room for them. With `keep`, the first job is kept for the caller's thread instead,
  // when a place among the runners is free and its handler is not transactional (a pool thread
  // keeps the connection such a handler needs): the caller must then call run_kept() with it.
  void submit(std::vector<detail::ClaimedJob> jobs, Kept* keep = nullptr);
  void submit(detail::ClaimedJob job);
  // Starts a kept job on this thread (or releases it, as a runner would), and returns when its
  // run ended. With one epoch accepted it does not wake the poller: the caller claims next, or
  // wakes the thread that does. With `release`, the job goes back to the queue without running.
  void run_kept(Kept kept, bool release = false);
  // Waits until no handler runs, or the timeout passes. True when idle.
  bool wait_idle(Millis timeout);
  // The same for the jobs of one epoch (submitted ones included).
  bool wait_epoch_idle(std::int64_t epoch, Millis timeout);
  // No more slot-freed callbacks after this returns (the poller they wake is going away).
  void detach_slot_free();

 private:
  // Cancellation of every run of one epoch: its flag, and the database calls of its
  // transactional handlers, cut when the epoch ends.
  struct EpochRuns {
    std::int64_t epoch = 0;
    std::atomic<bool> accepted{false};
    std::atomic<bool> ended{false};
    std::atomic<int> in_flight{0};  // submitted, not finished
    ~EpochRuns();
  };
  // One submitted job.
  struct Run {
    detail::ClaimedJob claimed;
    std::shared_ptr<EpochRuns> epoch;
    std::atomic<bool> cancel_asked{false};
  };

  // Starts the run (or releases it when it may not start) and does its bookkeeping; then wakes
  // the poller (on_slot_free) when few jobs wait, unless `wake_poller` is false.
  void start(const std::shared_ptr<Run>& run, bool wake_poller = true, bool release = false);
  // A pool task that starts queued jobs one after another while there are any and no more runners
  // than the limit.
  void runner();
  // Under ready_mutex_: how many more runners the queued jobs need now (counted as running).
  int spawn_locked();
  void post_runners(int count);
  // Under ready_mutex_: while jobs wait, a check a second later that some job started meanwhile.
  void arm_stall_check_locked();
  void stall_check();
  // Releases the queued jobs of epochs that are no longer accepted.
  void release_unstartable();
  // `allowed_at`: the instant start() read before its checks (JobContext::started_at).
  void run(Run& run, std::chrono::system_clock::time_point allowed_at);
  // Runs a transactional handler and commits its writes with the completion. Returns false when
  // the commit was fenced (the outcome is then settled: nothing more to record).
  bool run_transactional(const detail::HandlerEntry& entry, JobContext& ctx, const Run& run,
                         double& run_seconds);
  // After a transactional job's COMMIT lost its answer: what the server, asked on a new
  // connection, says became of that transaction (detail::transaction_status; "committed": the
  // job is done, and must be neither retried nor its failure counted as fenced). Waits up to
  // kCommitDoubtWait while the server has not ended it, or until the epoch ends.
  std::string commit_status(const std::string& xid, const Run& run);
  std::shared_ptr<EpochRuns> epoch_runs(std::int64_t epoch);
  // The next submitted job to start: the epochs (shards) take turns, each in claim order, so that
  // a shard just won does not wait behind the jobs its node had buffered for its other shards.
  // The turn is taken when a pool thread picks the job up; while CPU-bound jobs keep fewer places
  // than threads, the threads waiting for a place (enter()) already hold theirs, so a new shard's
  // first job may still come after those few.
  // Under ready_mutex_.
  std::shared_ptr<Run> next_ready_locked();

  const ExecutorConfig config_;
  const std::string local_settings_;  // SET LOCAL ... for a pooled handler transaction
  const detail::HandlerRegistry& handlers_;
  Completer& completer_;
  detail::JobObserver* const observer_;
  const std::function<bool(std::int64_t)> lease_valid_;
  std::mutex slot_free_mutex_;  // guards on_slot_free_ against detach during a callback
  std::function<void()> on_slot_free_;

  std::atomic<int> busy_{0};
  std::atomic<int> waiting_{0};              // submitted, not started by a thread yet
  std::atomic<double> mean_run_seconds_{0};  // updated by load and store: a lost update is fine
  std::atomic<double> mean_cpu_share_{0};    // the same; 0 until a job has run
  std::atomic<unsigned> samples_{0};
  const int cores_;
  std::atomic<int> refill_mark_{0};
  // The queue of submitted jobs and its runners; ready_mutex_ guards these and stall_timer_.
  std::mutex ready_mutex_;
  std::map<std::int64_t, std::deque<std::shared_ptr<Run>>> ready_;  // by epoch: not started
  int queued_ = 0;                                                  // jobs in ready_
  int runners_ = 0;  // runner tasks posted and not finished
  // No start for a second while jobs waited: every thread may run. Written under ready_mutex_;
  // read without it for the pool's gauge.
  std::atomic<bool> stalled_ = false;
  std::uint64_t starts_ = 0;          // jobs taken off the queue, ever
  std::uint64_t checked_starts_ = 0;  // starts_ when the stall check was armed
  bool stall_check_armed_ = false;
  std::chrono::steady_clock::time_point stall_check_due_{};  // when the armed check fires
  bool closing_ = false;                                     // the destructor runs
  std::int64_t last_epoch_ = 0;                              // the epoch whose job started last
  mutable std::mutex runs_mutex_;  // guards queue_busy_, runs_ and epochs_
  std::unordered_map<std::string, int> queue_busy_;
  std::unordered_multimap<std::int64_t, std::shared_ptr<Run>> runs_;
  std::vector<std::shared_ptr<EpochRuns>> epochs_;  // the current and recent epochs
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
  boost::asio::steady_timer stall_timer_;  // on pool_; guarded by ready_mutex_
};

}  // namespace baton::worker
