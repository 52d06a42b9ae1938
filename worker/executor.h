// Executor: runs handlers on a boost::asio::thread_pool of a fixed size and turns each run into
// an outcome for the completer. It counts its busy threads so that the poller never claims more
// jobs than it can start at once.
//
// Thread-safety: submit() from the poller thread; free_slots(), cancel() and wait_idle() from any.
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
  int free_slots() const { return config_.threads - busy_.load(); }
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
  bool run_transactional(const detail::HandlerEntry& entry, JobContext& ctx, double& run_seconds);

  const ExecutorConfig config_;
  const detail::HandlerRegistry& handlers_;
  Completer& completer_;
  detail::JobObserver* const observer_;
  std::mutex slot_free_mutex_;  // guards on_slot_free_ against detach during a callback
  std::function<void()> on_slot_free_;

  std::atomic<int> busy_{0};
  std::atomic<int> waiting_{0};     // submitted, not started by a thread yet
  mutable std::mutex queue_mutex_;  // guards queue_busy_
  std::unordered_map<std::string, int> queue_busy_;
  std::atomic<bool> cancelled_{false};
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
};

}  // namespace baton::worker
