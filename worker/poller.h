// Poller: while this node leads at an epoch, claims due jobs (up to the batch size per statement)
// and hands them to the executor. Besides one job per free thread it keeps a short buffer of
// claimed jobs waiting for a thread, sized from the jobs' mean run time so that a buffered job
// waits about 100 ms at most: threads do not wait for a claim round trip, while slow jobs are
// not claimed long before a thread can start them. It sleeps until a NOTIFY from an enqueue, the
// buffer running low, or the poll interval.
//
// Producers notify only while a leader may sleep (sql/0010_fast_enqueue.sql), so that they do
// not queue for PostgreSQL's notification lock while the leader works. Out of work, the poller
// takes the wake keys of its queues exclusively on its LISTENing session, claims once more, and
// only then sleeps; it drops them once a claim finds work. A producer that holds a key shared
// (it did not notify) keeps the poller from taking it until its transaction ends; meanwhile the
// poller polls, every 1 ms at first and every 50 ms (or the poll interval, if shorter) at most.
// While jobs stream in (two rounds in a row found jobs, the second more than one, and no claim
// came back full, held short by a limit kept across shards, or skipped at its queue's limit),
// the next claim waits claim_gather, so that one claim takes what arrived meanwhile rather than
// a few jobs per round trip. The first claim after a wake-up never waits, nor the claim after a
// full one; a written end that frees a claim (an ordered partition's) ends a gather.
// With shards, a node runs one poller per shard it leads, each with its own wake keys ("#<shard>"
// appended for shards above 0), all feeding the node's one executor.
// Two threads take turns claiming. Woken from sleep by an enqueue, the one claiming keeps the
// first job it claims and runs its handler itself (unless the handler is transactional: a pool
// thread has the connection it needs): an idle job then starts without waking a pool thread,
// one cross-CPU wake-up less on its latency. Claiming must not wait for a handler, so the other
// thread takes the turn over when the job has run for kKeptJobTurn (1 ms), or at once when
// claiming stops; a timer wakes it then, so that a short job wakes no other thread at all. While
// a thread runs a job it was handed the turn from, the other keeps none (its jobs go to the pool).
// Queues with a concurrency limit never have more jobs claimed than their limit; paused queues are
// skipped by the claim itself, and so are jobs of types this node has no handler for (they wait for
// a leader that has one). A NOTIFY 'cancel <id>' on the jobs channel is passed to the executor at
// once.
//
// Thread-safety: start()/stop()/join() from one owner thread; wake() from any thread. join()
// does not wait for a handler a claiming thread runs: that thread ends after its job, and the
// destructor waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "baton/config.h"
#include "baton/detail/backoff.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/lease.h"
#include "baton/detail/observer.h"
#include "baton/detail/waker.h"
#include "worker/claim_cursor.h"
#include "worker/executor.h"

namespace baton::worker {

// The claim session's planning, set on `options`: each claim planned once per session (generic
// plans, no JIT) and always as the claim index's ordered scan (no sequential scan, no sort). The
// poller's session plans so, and so do tests that claim as it does.
void plan_claims(detail::ConnectOptions& options);

struct PollerConfig {
  detail::ConnectOptions connect;
  std::string node_id;
  detail::LockName lock;
  std::vector<std::string> queues;          // empty: all
  std::map<std::string, int> queue_limits;  // most jobs of a queue running at once
  std::vector<std::string> types{};         // the job types this node has handlers for
  int shard = 0;                            // the shard whose jobs it claims (lock: its lock row)
  // Shards: other leaders claim the same queues, so a queue's limit is kept across the cluster
  // (detail::ClaimFilter::cluster_limit) instead of by this node's running jobs.
  bool cluster_limits = false;
  int batch_size = 1000;
  Millis poll_interval{1000};
  // While jobs stream in (see above), the next claim waits this long, so that it takes what
  // arrived meanwhile. 0: it claims again at once.
  Millis claim_gather{5};
  // A claim that waits this long for a row another transaction holds gives up, and the claims
  // of the next minute skip held rows (a row lock each) instead of waiting.
  Millis lock_timeout{200};
  // How long a claim may run while the lease is renewed: it is cut at the lease's end, or this
  // long after it was sent (a claim connection that stopped answering while the elector's did
  // not). 0: the lease's end as it stood when the claim was sent, renewals or not.
  Millis claim_time{0};
};

// `config` with the claim session's settings on its connection, as the poller opens it: no wait
// for the WAL flush, claims planned as plan_claims says, `config.lock_timeout` as the lock
// timeout, and bounds on statements and idle transactions.
PollerConfig with_claim_session(PollerConfig config);

class Poller {
 public:
  // `lease` is this node's leadership: checked before every claim, and the claims' deadline.
  Poller(PollerConfig config, Executor& executor, detail::JobObserver* observer,
         const detail::Lease& lease);
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  // Claims for `epoch` on a thread of its own (after joining the previous epoch's thread).
  void start(std::int64_t epoch);
  // No claim starts any more, and a claim in flight is cut: returns at once, never waiting for
  // the network. Idempotent.
  void stop();
  // For a graceful hand-over: no claim starts any more; returns at once. A claim in flight may
  // still come back, until finish(). A node that drains several shards tells every lane first,
  // so that no lane claims again while it waits for another's claim.
  void stop_claiming();
  // stop_claiming(), and a claim in flight may come back until `deadline` (its jobs go to the
  // executor) before it is cut as by stop(). A claim commits on its own, so a cut one may have
  // committed unanswered: its jobs would wait for the next leader's rescue, an attempt counted.
  // Then join().
  void finish(std::chrono::steady_clock::time_point deadline);
  void finish(Millis grace) { finish(std::chrono::steady_clock::now() + grace); }
  // Waits for the claiming thread to end (after stop()).
  void join();
  void wake();
  // A job's end was written that lets another be claimed (an ordered partition's, a job of a
  // queue limited across the cluster): wakes the poller, and ends a gather.
  void claim_freed();

 private:
  // One epoch's claiming: its own connection, so that a thread still finishing (cut off) never
  // shares one with the next.
  // A claim session that was cut: a claim it sent may have committed unanswered. Its jobs were
  // claimed after `after_us` and before `before_us` (the reconnection; 0 until then).
  struct Gap {
    std::int64_t after_us = 0;
    std::int64_t before_us = 0;
    detail::ServerSession cut;
    std::chrono::steady_clock::time_point since{};
    bool warned = false;
  };
  struct Run {
    std::int64_t epoch = 0;
    Run();
    ~Run();
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;
    // The turn to claim: one thread claims (everything below is its own while it has the turn),
    // the other waits for the turn, watching `look`, or runs a job it kept.
    std::mutex turn_mutex;
    bool turn_taken = false;
    int waiting_for_turn = 0;
    bool over = false;  // the claiming ended (stopped): no thread takes the turn again
    // The thread with the turn runs a kept job (since kept_since): the other may take the turn.
    bool in_kept_job = false;
    std::chrono::steady_clock::time_point kept_since{};
    int look = -1;            // a timerfd: the waiting thread looks at the turn when it fires
    Executor::Kept kept;      // claimed for the thread whose turn it is
    bool drop_keys = false;   // the wake keys are to be dropped (a claim found work)
    bool found_jobs = false;  // the last round claimed jobs
    bool reported = false;    // a database error was logged (until a claim succeeds)
    detail::Backoff backoff{Millis(50), Millis(2000)};
    detail::Backoff busy_poll{Millis(1), Millis(50)};  // polling while producers hold the keys
    std::atomic<bool> aborted{false};                  // its calls are being cut (until join)
    std::atomic<bool> stopping{false};
    // When stop_claiming() was first called (steady clock, ns; 0: not yet), for finish()'s log.
    std::atomic<std::int64_t> stop_asked_ns{0};
    // Set as the claiming thread ends (under ended_mutex), for finish().
    std::mutex ended_mutex;
    std::condition_variable ended_cv;
    bool ended = false;
    std::unique_ptr<pqxx::connection> conn;
    std::unique_ptr<pqxx::notification_receiver> receiver;
    std::vector<std::string> notifications;
    std::chrono::steady_clock::time_point skip_locked_until{};
    bool wake_keys_held = false;
    // Since when the wake keys have been refused without a break, and whether that was logged.
    std::optional<std::chrono::steady_clock::time_point> keys_refused_since;
    bool keys_warned = false;
    // The database time of this epoch's last claim whose answer came back (or of the last
    // jobs taken from an unanswered one): this node's later claims under the epoch are newer.
    std::int64_t last_claim_us = 0;
    detail::ServerSession session;  // the claim session's server session (pid 0: none)
    std::vector<Gap> gaps;          // cut claim sessions whose last claim may be unanswered
    std::chrono::steady_clock::time_point next_gap_check{};
    // Per kind of claim (a limited queue's name, or "" for the rest): where the next one starts.
    std::map<std::string, ClaimCursor> cursors;
    // A claim cut at the lease's end (it could not come back in time: large payloads, a slow
    // link or server) halves how many jobs the next ones take, down to one; claims that come
    // back full within a quarter of their time double it again. 0: no cap. A run that restarts
    // under the same epoch keeps it.
    int claim_cap = 0;
    int claim_wanted = 0;  // jobs the claim in flight asked for (0: none in flight)
    std::chrono::steady_clock::time_point claim_deadline{};
    std::chrono::steady_clock::time_point claim_sent{};      // the claim in flight's send
    std::chrono::steady_clock::time_point watch_bound{};     // the watched call's (watch())
    std::chrono::steady_clock::time_point cap_warned{};      // last "claiming at most" warning
    std::chrono::steady_clock::time_point one_job_warned{};  // last "one job was cut" warning
    std::chrono::steady_clock::time_point cancel_warned{};   // last "claim was cancelled" warning
  };
  struct Round {
    int jobs = 0;               // claimed
    bool room = false;          // some claim was tried (a thread or buffer place was free)
    bool more_waiting = false;  // some claim took all it asked for, or was held short
  };

  // One claiming thread: takes its turns until the claiming ends.
  void take_turns(Run& run, std::atomic<bool>& in_job);
  // Claims while it is this thread's turn: returns true when the turn was taken over (while
  // this thread ran a kept job), false when the claiming ended.
  bool loop(Run& run, std::atomic<bool>& in_job);
  // Runs run.kept on this thread; true when the turn is still this thread's afterwards.
  bool run_kept_here(Run& run, std::atomic<bool>& in_job);
  // Whether the other thread waits for the turn (the caller has it).
  static bool other_waits(Run& run);
  // Makes the waiting thread look at the turn after `after` (0: at once).
  static void look_after(Run& run, std::chrono::nanoseconds after);
  Round claim_round(Run& run);
  // Takes every wake key (true), or none.
  bool take_wake_keys(Run& run);
  void drop_wake_keys(Run& run);
  // Logs once when another session has kept a wake key from this leader for long.
  void warn_if_keys_held_long(Run& run);
  void wait(Run& run, Millis timeout);
  // Waits claim_gather before the next claim of a stream (unless the claiming stops), passing on
  // the cancels that arrive meanwhile.
  void gather(Run& run);
  // How many claimed jobs may wait for a thread, from how long jobs run.
  int buffer_size() const;
  // After a claim failed: when it ran out of time (the lease's end, or the statement timeout)
  // while this node still leads, claim fewer jobs at a time.
  void claim_was_cut(Run& run, int wanted, bool statement_timeout);
  // The latest a call sent at `sent` may run while the lease is renewed (claim_time).
  std::chrono::steady_clock::time_point call_bound(
      std::chrono::steady_clock::time_point sent) const;
  // Watches a call on the run's session: cut when the lease ends, and at `bound` even while the
  // lease is renewed.
  detail::CallWatch::Armed watch(Run& run, std::chrono::steady_clock::time_point bound);
  // Runs the jobs of claims that committed unanswered, once their cut sessions have ended.
  void take_unanswered_claims(Run& run);
  // Hands the cancellations that arrived by NOTIFY to the executor.
  void pass_cancels(Run& run);

  const PollerConfig config_;
  Executor& executor_;
  detail::JobObserver* const observer_;
  const detail::Lease& lease_;
  std::vector<std::string> wake_keys_;
  // Claiming thread only: the mean payload size of claimed jobs (a large one lifts it at once).
  double mean_payload_bytes_ = 0;  // "<channel>/<queue>", or "<channel>/*" for every queue
  std::shared_ptr<Run> run_;       // the current epoch's (owner thread only)
  // What a run left for the next run of the same epoch (a shard's hand-over that did not drain
  // starts the poller again under its epoch): its last claim's time and unsettled cut sessions.
  std::int64_t carried_epoch_ = 0;
  std::int64_t carried_last_claim_us_ = 0;
  int carried_claim_cap_ = 0;
  std::vector<Gap> carried_gaps_;
  detail::Waker waker_;
  std::atomic<bool> claim_freed_{false};  // set by claim_freed(), cleared as a round begins
  // A claiming thread, and whether it runs a kept job now.
  struct Thread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> in_job = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  std::vector<Thread> threads_;  // the current run's
  std::vector<Thread> lent_;     // earlier runs' threads that were running a job at join()
  // Joins the lent threads that ended (all of them, waiting for their jobs, with `all`).
  void reap(bool all);
};

}  // namespace baton::worker
