// Executor: runs handlers on a boost::asio::thread_pool of a fixed size and turns each run into
// an outcome for the completer. Submitted jobs wait in the pool's queue for a free thread; the
// poller keeps that queue short (see poller.h). A job starts only while the executor accepts its
// epoch: once leadership ends, or a graceful shutdown begins, jobs that have not started are
// released back to the queue through the completer instead.
//
// Thread-safety: submit() from the poller thread; every other member from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>

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
  int threads = 8;
  std::string node_id;
  detail::RetryPolicy retry;
};

class Executor {
 public:
  Executor(ExecutorConfig config, const detail::HandlerRegistry& handlers, Completer& completer,
           detail::JobObserver* observer, std::function<void()> on_slot_free);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  int threads() const { return config_.threads; }
  // Threads minus submitted jobs (running or waiting); negative while jobs wait.
  int free_slots() const { return config_.threads - busy_.load(); }
  // Submitted jobs that wait for a thread.
  int waiting() const { return waiting_.load(); }
  // Moving average of how long a handler runs, in seconds; 0 until one has run.
  double mean_run_seconds() const { return mean_run_seconds_.load(std::memory_order_relaxed); }
  // A finished job wakes the poller (on_slot_free) only when at most `mark` jobs still wait.
  void set_refill_mark(int mark) { refill_mark_.store(mark, std::memory_order_relaxed); }
  // Jobs of `epoch` may start; jobs of any other epoch are released instead.
  void accept(std::int64_t epoch) { accepting_.store(epoch); }
  // No job starts any more (until the next accept); those waiting are released.
  void stop_accepting() { accepting_.store(0); }
  // Jobs of `queue` running now.
  int busy_in(const std::string& queue) const;
  // Starts the job on a pool thread. The caller made sure a slot is free.
  void submit(detail::ClaimedJob job);
  // Raises the cancellation flag that handlers see through JobContext::cancelled().
  void cancel(bool on) { cancelled_.store(on); }
  // Waits until no handler runs, or the timeout passes. True when idle.
  bool wait_idle(Millis timeout);
  // No more slot-freed callbacks after this returns (the poller they wake is going away).
  void detach_slot_free();

 private:
  void run(const detail::ClaimedJob& job);
  // Runs a transactional handler and commits its writes with the completion. Returns false when
  // the commit was fenced (the outcome is then settled: nothing more to record).
  bool run_transactional(const detail::HandlerEntry& entry, JobContext& ctx,
                         const std::string& row_at, double& run_seconds);

  const ExecutorConfig config_;
  const detail::HandlerRegistry& handlers_;
  Completer& completer_;
  detail::JobObserver* const observer_;
  std::mutex slot_free_mutex_;  // guards on_slot_free_ against detach during a callback
  std::function<void()> on_slot_free_;

  std::atomic<int> busy_{0};
  std::atomic<int> waiting_{0};              // submitted, not started by a thread yet
  std::atomic<double> mean_run_seconds_{0};  // updated by load and store: a lost update is fine
  std::atomic<int> refill_mark_{0};
  std::atomic<std::int64_t> accepting_{0};  // the epoch whose jobs may start; 0: none
  mutable std::mutex queue_mutex_;          // guards queue_busy_
  std::unordered_map<std::string, int> queue_busy_;
  std::atomic<bool> cancelled_{false};
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
};

}  // namespace baton::worker
