// Poller: leader-gated claiming (see poller.h).
#include "worker/poller.h"

#include <poll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "baton/detail/backoff.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/clock.h"
#include "baton/detail/text.h"

namespace baton::worker {
namespace {

// Keeps the payloads: a queue name (an enqueue, a resume) or "cancel <id>".
struct WakeReceiver : pqxx::notification_receiver {
  WakeReceiver(pqxx::connection_base& conn, const std::string& channel,
               std::vector<std::string>& out)
      : pqxx::notification_receiver(conn, channel), out_(out) {}
  void operator()(const std::string& payload, int) override {
    if (payload.rfind("cancel ", 0) == 0) out_.push_back(payload);
  }
  std::vector<std::string>& out_;
};

// The wake keys (sql/0010_fast_enqueue.sql): taken exclusively before sleeping, so that producers
// notify only while this leader may sleep. All or none: a key another session holds is let go
// of with the rest.
constexpr const char* kTakeWakeKeysSql =
    "SELECT bool_and(pg_try_advisory_lock(hashtextextended(k, 0))) FROM unnest($1::text[]) k";
constexpr const char* kDropWakeKeysSql = "SELECT pg_advisory_unlock_all()";

// SQLSTATE 55P03: lock_not_available, as a claim that waited lock_timeout for a row reports.
bool lock_timed_out(const std::exception& e) {
  const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e);
  return sql != nullptr && sql->sqlstate() == "55P03";
}

// The session's statement_timeout (a lease longer than it lets a claim run into it first).
bool statement_timed_out(const std::exception& e) {
  const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e);
  return sql != nullptr && sql->sqlstate() == "57014";
}

// How long a thread runs a job it kept before the other takes the turn to claim.
constexpr auto kKeptJobTurn = std::chrono::milliseconds(1);

}  // namespace

// The claim session: a claim need not wait for its WAL flush (the first outcome of any claimed
// job commits synchronously and so flushes the claim's earlier WAL with it; a crash that loses a
// claim only leaves its job available, to run again as after any crash), and a row held by
// another transaction (an operator's SELECT ... FOR UPDATE) must not stall every claim: give up
// after a moment, then skip held rows for a while.
PollerConfig with_claim_session(PollerConfig config) {
  config.connect.synchronous_commit_off = true;
  plan_claims(config.connect);
  config.connect.lock_timeout_ms = static_cast<int>(config.lock_timeout.count());
  if (config.connect.statement_timeout_ms == 0) config.connect.statement_timeout_ms = 30'000;
  if (config.connect.idle_in_transaction_timeout_ms == 0) {
    config.connect.idle_in_transaction_timeout_ms = 10'000;
  }
  return config;
}

void plan_claims(detail::ConnectOptions& options) {
  // Planned once: the claim's plan (its index scan in claim order) does not depend on the values,
  // and planning it took longer than running it for an idle queue's one job.
  options.generic_plans = true;
  // And always that index scan: with sorts allowed, the plan could read and sort every due job.
  options.order_from_index = true;
}

Poller::Poller(PollerConfig config, Executor& executor, detail::JobObserver* observer,
               const detail::Lease& lease)
    : config_(with_claim_session(std::move(config))),
      executor_(executor),
      observer_(observer),
      lease_(lease) {
  const std::string channel = detail::jobs_channel(config_.connect.schema);
  // (Appended, not "#" + to_string(): GCC 12 at -O3 warns -Wrestrict on that form, a false
  // positive that the Release build's -Werror turns into an error.)
  std::string suffix;
  if (config_.shard > 0) suffix.append("#").append(std::to_string(config_.shard));
  if (config_.queues.empty()) wake_keys_.push_back(channel + "/*" + suffix);
  for (const auto& q : config_.queues)
    wake_keys_.push_back(channel + "/" + q + suffix);
}

Poller::~Poller() {
  stop();
  join();
  reap(true);
}

void Poller::start(std::int64_t epoch) {
  stop();
  join();
  run_ = std::make_shared<Run>();
  run_->epoch = epoch;
  if (epoch == carried_epoch_) {
    run_->last_claim_us = carried_last_claim_us_;
    run_->gaps = std::move(carried_gaps_);
    run_->claim_cap = carried_claim_cap_;
  }
  carried_gaps_.clear();
  run_->busy_poll = detail::Backoff(Millis(1), std::min(config_.poll_interval, Millis(50)));
  reap(false);
  for (int i = 0; i < 2; ++i) {
    Thread t;
    t.thread = std::thread([this, run = run_, in_job = t.in_job, done = t.done] {
      take_turns(*run, *in_job);
      done->store(true);
    });
    threads_.push_back(std::move(t));
  }
}

Poller::Run::Run() : look(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) {
  // Without it, no job is kept (every job starts on the pool), and the waiting thread looks at
  // the turn every 50 ms.
  if (look < 0) {
    spdlog::warn("poller: no timerfd ({}); idle jobs start on the pool",
                 std::error_code(errno, std::generic_category()).message());
  }
}

Poller::Run::~Run() {
  if (look >= 0) close(look);
}

void Poller::look_after(Run& run, std::chrono::nanoseconds after) {
  if (run.look < 0) return;
  const auto ns = std::max<std::int64_t>(after.count(), 1);  // 0 would disarm it
  itimerspec when{};
  when.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
  when.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  timerfd_settime(run.look, 0, &when, nullptr);
}

void Poller::take_turns(Run& run, std::atomic<bool>& in_job) {
  for (;;) {
    {
      std::unique_lock lock(run.turn_mutex);
      ++run.waiting_for_turn;
      for (;;) {
        if (run.over) {
          --run.waiting_for_turn;
          return;
        }
        if (!run.turn_taken) {
          run.turn_taken = true;
          break;
        }
        // The thread with the turn has run a kept job for long enough, or claiming stops: the
        // turn is this thread's now (the other finds that when its job ends).
        if (run.in_kept_job && (run.stopping.load() || std::chrono::steady_clock::now() >=
                                                           run.kept_since + kKeptJobTurn)) {
          run.in_kept_job = false;
          break;
        }
        lock.unlock();
        pollfd fd{run.look, POLLIN, 0};
        ::poll(&fd, 1, run.look >= 0 ? -1 : 50);
        if (run.look >= 0) {
          std::uint64_t fired = 0;
          [[maybe_unused]] const auto n = ::read(run.look, &fired, sizeof fired);
        }
        lock.lock();
      }
      --run.waiting_for_turn;
    }
    if (loop(run, in_job)) continue;  // the turn was taken over while this thread ran a job
    {
      std::lock_guard lock(run.turn_mutex);
      run.over = true;
    }
    look_after(run, std::chrono::nanoseconds(0));
    {
      std::lock_guard lock(run.ended_mutex);
      run.ended = true;
    }
    run.ended_cv.notify_all();
    // A job kept by a round that then stopped (a later claim of it was cut or failed) goes back
    // to the queue, as the jobs claimed and not started do when claiming stops: run here,
    // join() would wait for it.
    executor_.run_kept(std::exchange(run.kept, {}), true);
    return;
  }
}

bool Poller::run_kept_here(Run& run, std::atomic<bool>& in_job) {
  // Taken out before the turn can be taken over: the Run is the other thread's from then on.
  auto kept = std::exchange(run.kept, {});
  {
    std::lock_guard lock(run.turn_mutex);
    // Before the turn can be taken over: join() then finds this thread in its job.
    in_job.store(true);
    run.in_kept_job = true;
    run.kept_since = std::chrono::steady_clock::now();
  }
  look_after(run, kKeptJobTurn);
  try {
    executor_.run_kept(std::move(kept));
  } catch (const std::exception& e) {
    // Not the handler's (the executor catches those) but its bookkeeping's (out of memory):
    // the turn must still be settled below, or two threads would claim.
    spdlog::error("poller: a job run on the claiming thread failed: {}", e.what());
  }
  std::lock_guard lock(run.turn_mutex);
  in_job.store(false);
  if (!run.in_kept_job) {
    // The other thread claims now, and may sleep for want of a free place: the job's is free.
    wake();
    return false;
  }
  run.in_kept_job = false;
  itimerspec off{};
  timerfd_settime(run.look, 0, &off, nullptr);
  return true;
}

bool Poller::other_waits(Run& run) {
  std::lock_guard lock(run.turn_mutex);
  return run.waiting_for_turn > 0;
}

void Poller::reap(bool all) {
  for (auto it = lent_.begin(); it != lent_.end();) {
    if (!all && !it->done->load()) {
      ++it;
      continue;
    }
    if (it->thread.joinable()) it->thread.join();
    it = lent_.erase(it);
  }
}

void Poller::stop_claiming() {
  if (!run_) return;
  std::int64_t none = 0;
  run_->stop_asked_ns.compare_exchange_strong(none, detail::steady_now_ns());
  run_->stopping.store(true);
  wake();
  // A thread in a kept job does not see the stop: the other takes the turn to end the claiming.
  look_after(*run_, std::chrono::nanoseconds(0));
}

void Poller::finish(std::chrono::steady_clock::time_point deadline) {
  if (!run_) return;
  stop_claiming();
  bool ended = false;
  {
    std::unique_lock lock(run_->ended_mutex);
    ended = run_->ended_cv.wait_until(lock, deadline, [&] { return run_->ended; });
  }
  if (!ended) {
    spdlog::warn(
        "poller: still in a database call {}ms into the hand-over, cut now; if that call was "
        "a claim that committed, its jobs wait for the next leader's rescue",
        (detail::steady_now_ns() - run_->stop_asked_ns.load()) / 1'000'000);
  }
  stop();
}

void Poller::stop() {
  if (!run_) return;
  run_->stopping.store(true);
  wake();
  look_after(*run_, std::chrono::nanoseconds(0));
  // A claim in flight is of no use any more: cut it rather than wait for it.
  if (!run_->aborted.exchange(true)) {
    detail::CallWatch::instance().abort(detail::owner_of(run_.get()));
  }
}

void Poller::join() {
  if (run_ && !threads_.empty()) {
    std::unique_lock lock(run_->ended_mutex);
    run_->ended_cv.wait(lock, [&] { return run_->ended; });
  }
  // A thread in a handler is not waited for: it ends after its job (reap()).
  for (auto& t : threads_) {
    if (t.in_job->load()) {
      lent_.push_back(std::move(t));
    } else if (t.thread.joinable()) {
      t.thread.join();
    }
  }
  threads_.clear();
  if (run_ && run_->aborted.load()) {
    detail::CallWatch::instance().end_abort(detail::owner_of(run_.get()));
  }
  if (run_) {
    carried_epoch_ = run_->epoch;
    carried_last_claim_us_ = run_->last_claim_us;
    carried_claim_cap_ = run_->claim_cap;
    carried_gaps_ = std::move(run_->gaps);
  }
  run_.reset();
}

void Poller::wake() {
  waker_.wake();
}

void Poller::claim_freed() {
  claim_freed_.store(true);
  waker_.wake();
}

void Poller::wait(Run& run, Millis timeout) {
  // A cut session not yet settled is looked at again soon.
  if (!run.gaps.empty()) timeout = std::min(timeout, Millis(25));
  waker_.wait(run.conn ? run.conn->sock() : -1, timeout);
}

void Poller::gather(Run& run) {
  if (config_.claim_gather.count() <= 0) return;
  // A cancel the claim read off the socket: poll() would not see it.
  run.conn->get_notifs();
  pass_cancels(run);
  const auto began = std::chrono::steady_clock::now();
  const auto until = began + config_.claim_gather;
  // Only a stop, or a written end that lets another job be claimed (claim_freed()), ends it
  // early. The executor's wakes (a job ended, places freed) do not: a stream lacks jobs, not
  // room, and every job's end would cut the gather short. Each turn ends at a wake, a
  // notification or the end; the count only bounds a socket that is always readable.
  for (int i = 0; i < 100'000 && !run.stopping.load() && !claim_freed_.load(); ++i) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    wait(run, std::chrono::ceil<Millis>(left));
    run.conn->get_notifs();
    pass_cancels(run);
  }
  if (observer_ != nullptr) {
    observer_->claim_gathered(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  }
}

int Poller::buffer_size() const {
  // A buffered job waits for one of the threads to finish: about position * run time / threads.
  // Keep that under 100 ms; no buffer until a job's run time is known.
  constexpr double kMaxWaitSeconds = 0.1;
  const double run = executor_.mean_run_seconds();
  if (run <= 0) return 0;
  const double fits = executor_.concurrency() * kMaxWaitSeconds / std::max(run, 1e-6);
  // And its payloads under 64 MiB: a batch size of 1,000 is right for small payloads, not for
  // large ones.
  constexpr double kMaxBufferBytes = 64.0 * 1024 * 1024;
  const double by_size = kMaxBufferBytes / std::max(mean_payload_bytes_, 1.0);
  // And two batches: the next claim goes out once half the buffer is left (the refill mark), so
  // with a buffer of one batch every claim of a drain after the first took about half a batch
  // (578 jobs a claim over a 200,000-job drain; 971 with two).
  return static_cast<int>(std::min<double>({2.0 * config_.batch_size, fits, by_size}));
}

Poller::Round Poller::claim_round(Run& run) {
  const auto epoch = run.epoch;
  Round round;
  // This round's claims see whatever a written end freed before it.
  claim_freed_.store(false);
  // Each kind of claim starts after the last job it claimed while its claims come back full
  // (worker/claim_cursor.h): `kind` is the limited queue it claims, or "" for the rest.
  auto claim = [&](const std::string& kind, int want, const std::vector<std::string>& queues,
                   const std::vector<std::string>& except, int cluster_limit = 0) {
    if (run.claim_cap > 0) want = std::min(want, run.claim_cap);
    // A limited queue at its limit: its jobs wait for a place, which its running jobs' ends free
    // (the executor wakes this poller then), so no gather may hold the next claim back.
    if (want <= 0 && !kind.empty()) round.more_waiting = true;
    if (want <= 0 || run.stopping.load() || !lease_.valid(epoch)) return;
    auto& cursor = run.cursors[kind];
    const auto start = std::chrono::steady_clock::now();
    auto after = cursor.next(start);
    const detail::ClaimFilter filter{
        queues,        except,        config_.types, start < run.skip_locked_until,
        config_.shard, cluster_limit, after};
    std::vector<detail::ClaimedJob> jobs;
    {
      // A claim that has not come back by the lease's end is of no use: it is cut then. Renewals
      // move that end, up to claim_time after the send: on a machine whose cores are taken by
      // producers a claim can take longer than one lease, and cutting it (reconnecting, looking
      // for its jobs, claiming again) only took more of the time the drain needed.
      run.claim_deadline = call_bound(start);
      run.claim_sent = start;
      run.claim_wanted = want;
      auto armed = watch(run, run.claim_deadline);
      jobs = detail::claim_jobs(*run.conn, {config_.lock, config_.node_id, epoch}, want, filter,
                                config_.connect.schema);
      run.claim_wanted = 0;
    }
    const auto end = std::chrono::steady_clock::now();
    if (observer_ != nullptr)
      observer_->claim_took(std::chrono::duration<double>(end - start).count(), !jobs.empty());
    if (run.claim_cap > 0 && static_cast<int>(jobs.size()) == want &&
        end - start < (run.claim_deadline - start) / 4) {
      // Full and well within its time: take more again.
      run.claim_cap = run.claim_cap >= config_.batch_size / 2 ? 0 : run.claim_cap * 2;
    }
    cursor.claimed(after, want, jobs, start, end);
    for (const auto& j : jobs) {
      // A moving mean over about the last 1,000 jobs.
      const auto bytes = static_cast<double>(j.job.payload.size());
      mean_payload_bytes_ += (bytes - mean_payload_bytes_) / 1000.0;
      mean_payload_bytes_ = std::max(mean_payload_bytes_, bytes / 100.0);
    }
    if (!jobs.empty()) run.last_claim_us = std::max(run.last_claim_us, jobs.front().claimed_at_us);
    if (cluster_limit > 0) {
      for (auto& j : jobs)
        j.cluster_limited = true;
    }
    round.room = true;
    round.jobs += static_cast<int>(jobs.size());
    // More may be waiting after a claim that took all it asked for, and after a shard's share of
    // a limited queue (claim_jobs cuts it to the cluster's free places, to none while other
    // lanes hold them): a place another node frees wakes no one here. (Ordered partitions need
    // no such rule: their ends are written here, and claim_freed() ends the gather.)
    if (static_cast<int>(jobs.size()) == want || cluster_limit > 0) round.more_waiting = true;
    // Woken from sleep (holding the wake keys): this thread runs the first job itself, after
    // handing the turn over (see poller.h).
    const bool keep =
        run.wake_keys_held && run.look >= 0 && !run.kept && !jobs.empty() && other_waits(run);
    executor_.submit(std::move(jobs), keep ? &run.kept : nullptr);
  };
  // Queues with a concurrency limit first, each claimed up to its own free slots; then the rest.
  const int buffer = buffer_size();
  executor_.set_refill_mark(buffer / 2);
  // The node's free places and buffer. With shards, the lanes share them: a shard under its fair
  // part (a shard just won, on a node busy with its others) claims up to that part even when the
  // others filled them, rather than wait for them to drain; the overshoot is bounded by that part.
  auto free_room = [&] {
    const int total = executor_.free_slots() + buffer;
    const int lanes = executor_.accepted_epochs();
    if (lanes <= 1) return total;
    const int fair = (executor_.concurrency() + buffer + lanes - 1) / lanes;
    return std::max(total, fair - executor_.in_flight(epoch));
  };
  int room = free_room();
  std::vector<std::string> limited;
  for (const auto& [queue, limit] : config_.queue_limits) {
    if (!config_.queues.empty() &&
        std::find(config_.queues.begin(), config_.queues.end(), queue) == config_.queues.end()) {
      continue;
    }
    limited.push_back(queue);
    if (config_.cluster_limits) {
      claim(queue, std::min(room, config_.batch_size), {queue}, {}, limit);
    } else {
      claim(queue, std::min({room, limit - executor_.busy_in(queue), config_.batch_size}), {queue},
            {});
    }
    room = free_room();
  }
  std::vector<std::string> rest;
  for (const auto& q : config_.queues) {
    if (config_.queue_limits.count(q) == 0) rest.push_back(q);
  }
  if (config_.queues.empty() || !rest.empty()) {
    claim(std::string(), std::min(room, config_.batch_size), rest, limited);
  }
  return round;
}

std::chrono::steady_clock::time_point Poller::call_bound(
    std::chrono::steady_clock::time_point sent) const {
  return config_.claim_time.count() > 0 ? sent + config_.claim_time : lease_.deadline();
}

detail::CallWatch::Armed Poller::watch(Run& run, std::chrono::steady_clock::time_point bound) {
  // Two pointers: std::function keeps them without allocating, once per call on the claim path.
  // The watchdog reads watch_bound under its lock, which arm() and disarming also take.
  run.watch_bound = bound;
  return detail::CallWatch::instance().arm(
      *run.conn, std::min(lease_.deadline(), bound), detail::owner_of(&run), [this, &run] {
        const auto end = lease_.deadline();
        return lease_.epoch() == run.epoch ? std::min(end, run.watch_bound)
                                           : std::chrono::steady_clock::time_point{};
      });
}

bool Poller::take_wake_keys(Run& run) {
  auto armed = watch(run, call_bound(std::chrono::steady_clock::now()));
  pqxx::nontransaction tx(*run.conn);
  if (tx.exec_params(kTakeWakeKeysSql, detail::text_array(wake_keys_))[0][0].as<bool>(false)) {
    run.wake_keys_held = true;
    return true;
  }
  tx.exec(kDropWakeKeysSql);
  return false;
}

void Poller::warn_if_keys_held_long(Run& run) {
  // Producers hold a key for the length of a transaction; a key refused for 10 s on end is a
  // session that holds it for good (a long transaction that enqueued, or a stranger).
  constexpr auto kLong = std::chrono::seconds(10);
  const auto now = std::chrono::steady_clock::now();
  if (!run.keys_refused_since) run.keys_refused_since = now;
  if (now - *run.keys_refused_since < kLong || run.keys_warned) return;
  run.keys_warned = true;
  spdlog::warn(
      "poller: another session has held a wake key of this leader's queues for {}s (a long "
      "transaction that enqueued, or a session locking '{}_jobs/<queue>'); jobs still start, but "
      "the leader polls every {}ms instead of sleeping until a NOTIFY",
      std::chrono::duration_cast<std::chrono::seconds>(now - *run.keys_refused_since).count(),
      config_.connect.schema, std::min(config_.poll_interval, Millis(50)).count());
}

void Poller::drop_wake_keys(Run& run) {
  auto armed = watch(run, call_bound(std::chrono::steady_clock::now()));
  pqxx::nontransaction tx(*run.conn);
  tx.exec(kDropWakeKeysSql);
  run.wake_keys_held = false;
  run.drop_keys = false;
}

void Poller::take_unanswered_claims(Run& run) {
  const auto now = std::chrono::steady_clock::now();
  if (now < run.next_gap_check) return;
  run.next_gap_check = now + std::chrono::milliseconds(25);
  for (auto it = run.gaps.begin(); it != run.gaps.end();) {
    if (it->before_us == 0) {
      ++it;
      continue;
    }
    bool busy = false;
    {
      auto armed = watch(run, call_bound(std::chrono::steady_clock::now()));
      busy = detail::cut_session_busy(*run.conn, it->cut);
    }
    // The cut session's transaction may still be committing on the server (stalled): its jobs
    // are taken once it has ended; meanwhile this session claims as usual.
    if (busy) {
      if (!it->warned && now - it->since > std::chrono::seconds(5)) {
        it->warned = true;
        spdlog::warn(
            "poller: the claim session that was cut (server pid {}) is still in a transaction "
            "5s later; should its claim commit, its jobs run once that session ends",
            it->cut.pid);
      }
      ++it;
      continue;
    }
    // An epoch that ended leaves its running jobs to the next leader's rescue.
    if (!lease_.valid(run.epoch)) return;
    std::vector<detail::ClaimedJob> jobs;
    {
      auto armed = watch(run, call_bound(std::chrono::steady_clock::now()));
      jobs = detail::unanswered_claim(*run.conn, {config_.lock, config_.node_id, run.epoch},
                                      it->after_us, it->before_us, config_.connect.schema);
    }
    it = run.gaps.erase(it);
    if (jobs.empty()) continue;
    // Taken as a claim is: later claims of the epoch are newer than this.
    run.last_claim_us = std::max(run.last_claim_us, jobs.front().claimed_at_us);
    const auto known = executor_.running_ids();
    std::erase_if(jobs, [&](const detail::ClaimedJob& j) {
      return std::find(known.begin(), known.end(), j.job.id) != known.end();
    });
    const auto taken = jobs.size();
    executor_.submit(std::move(jobs));
    spdlog::warn(
        "poller: {} jobs of a claim that committed as its session was cut (its answer never came "
        "back) run now, under the same epoch {}",
        taken, run.epoch);
  }
}

void Poller::claim_was_cut(Run& run, int wanted, bool statement_timeout) {
  const auto now = std::chrono::steady_clock::now();
  // Only a claim that ran out of time while this node still leads: one that failed before its
  // deadline (a lost connection, a restart), or at the end of leadership (the lease was not
  // renewed meanwhile), says nothing about its size.
  if (run.stopping.load() || !lease_.valid(run.epoch)) return;
  if (!statement_timeout && now < run.claim_deadline) return;
  if (observer_ != nullptr) {
    observer_->claim_cut(statement_timeout ? detail::ClaimCut::statement_timeout
                                           : detail::ClaimCut::lease_end);
  }
  // 57014 is also a cancel request (an operator's pg_cancel_backend): one that came before the
  // statement timeout could run out says nothing about the claim's size.
  if (statement_timeout &&
      now - run.claim_sent < std::chrono::milliseconds(config_.connect.statement_timeout_ms)) {
    if (now - run.cancel_warned >= std::chrono::minutes(1)) {
      run.cancel_warned = now;
      spdlog::warn(
          "poller: a claim was cancelled on the server after {}ms, before its statement timeout "
          "({}ms): a cancel request, such as pg_cancel_backend; claiming again",
          std::chrono::duration_cast<std::chrono::milliseconds>(now - run.claim_sent).count(),
          config_.connect.statement_timeout_ms);
    }
    return;
  }
  const std::string ran_out = statement_timeout ? "its statement timeout ran out"
                              : config_.claim_time.count() > 0
                                  ? "its time ran out (" +
                                        std::to_string(config_.claim_time.count()) +
                                        "ms, three of the leader's own leases)"
                                  : "the lease ended";
  if (wanted > 1) {
    run.claim_cap = wanted / 2;
    // A stall cuts a few claims in a row: one warning a minute, the rest at debug level.
    const bool warn = now - run.cap_warned >= std::chrono::minutes(1);
    if (warn) run.cap_warned = now;
    spdlog::log(warn ? spdlog::level::warn : spdlog::level::debug,
                "poller: a claim of {} jobs was still running when {}, and was cut; claiming at "
                "most {} at a time until claims come back in time (the server or the link is "
                "slow, or the payloads are large)",
                wanted, ran_out, run.claim_cap);
  } else if (now - run.one_job_warned >= std::chrono::minutes(1)) {
    run.one_job_warned = now;
    if (statement_timeout) {
      spdlog::warn(
          "poller: a claim of one job ran into its session's statement timeout; the server is "
          "stalled, or the job's payload is too large to fetch in that time");
    } else {
      spdlog::warn(
          "poller: a claim of one job was still running when {}, and was cut; the job's payload "
          "may be too large to fetch in that time, or the server or the link too slow: raise "
          "--lock-ttl (a claim's time is three of the leader's own leases)",
          ran_out);
    }
  }
}

void Poller::pass_cancels(Run& run) {
  for (const auto& payload : run.notifications) {
    std::int64_t id = 0;
    const auto text = std::string_view(payload).substr(7);
    if (std::from_chars(text.data(), text.data() + text.size(), id).ec == std::errc{}) {
      executor_.cancel_job(id);
    }
  }
  run.notifications.clear();
}

bool Poller::loop(Run& run, std::atomic<bool>& in_job) {
  while (!run.stopping.load()) {
    // A job kept for this thread (from a round that then failed).
    if (run.kept && !run_kept_here(run, in_job)) return true;
    try {
      if (!run.conn) {
        run.conn = detail::connect(config_.connect, detail::owner_of(&run));
        if (run.stopping.load()) break;
        run.receiver = std::make_unique<WakeReceiver>(
            *run.conn, detail::jobs_channel(config_.connect.schema), run.notifications);
        run.session = detail::server_session(*run.conn);
        for (auto& gap : run.gaps) {
          if (gap.before_us == 0) gap.before_us = run.session.now_us;
        }
      }
      // Working again (the last claim found jobs): producers need not notify.
      if (run.drop_keys) drop_wake_keys(run);
      if (!run.gaps.empty()) take_unanswered_claims(run);
      const Round round = claim_round(run);
      if (run.reported) spdlog::info("poller: database reachable again");
      run.reported = false;
      run.backoff.reset();
      if (round.jobs > 0) {
        run.busy_poll.reset();
        run.keys_refused_since.reset();  // producers at work, not a session holding a key
        run.drop_keys = run.wake_keys_held;
        // Its job first; then this thread (or the other, if the job ran long) drops the keys.
        if (run.kept && !run_kept_here(run, in_job)) return true;
        if (run.drop_keys) drop_wake_keys(run);
        // Claim again: a round that found fewer jobs than it had room for ends only in an empty
        // round, which takes the wake keys before sleeping. (Sleeping after this one, without
        // the keys, a job whose producer did not notify would wait for the poll.) At once,
        // unless jobs stream in: this round took more than one job, the one before found jobs
        // too, and nothing was left waiting. Then claiming at once takes a few jobs a round
        // trip, and the claims' CPU comes off the producers' (on a small machine, a claim's
        // fixed cost per job doubles the leader's CPU): waiting claim_gather lets the next claim
        // take what arrived meanwhile, for at most that much more waiting per job. The first
        // claim after a wake-up never waits, nor do jobs that come one at a time (a chain of
        // jobs, each enqueuing the next).
        const bool stream = run.found_jobs && round.jobs > 1 && !round.more_waiting;
        run.found_jobs = true;
        if (stream) gather(run);
        continue;
      }
      run.found_jobs = false;
      // A NOTIFY that arrived during the claim is already read off the socket: poll() would
      // not see it.
      if (run.conn->get_notifs() > 0) {
        pass_cancels(run);
        continue;
      }
      // Out of work (a claim had room and found nothing). Sleep only holding the wake keys, and
      // after one more claim with them held: a producer that did not notify committed before
      // we got the keys.
      if (round.room && !run.wake_keys_held) {
        if (take_wake_keys(run)) {
          run.keys_refused_since.reset();
          run.keys_warned = false;
          continue;
        }
        // Producers are in their enqueue transactions (or another session holds a key): their
        // jobs will be there in a moment.
        warn_if_keys_held_long(run);
        wait(run, run.busy_poll.next());
        run.conn->get_notifs();
        pass_cancels(run);
        continue;
      }
      // Keys held, or no free place: the executor wakes us when places free up, and the next
      // claim sees whatever was queued meanwhile.
      wait(run, config_.poll_interval);
      run.conn->get_notifs();
      pass_cancels(run);
    } catch (const std::exception& e) {
      const int claim_wanted = std::exchange(run.claim_wanted, 0);
      if (lock_timed_out(e)) {
        // A claim's (not the look for an unanswered claim's), while this node leads.
        if (observer_ != nullptr && claim_wanted > 0 && !run.stopping.load() &&
            lease_.valid(run.epoch)) {
          observer_->claim_cut(detail::ClaimCut::row_locked);
        }
        if (std::chrono::steady_clock::now() >= run.skip_locked_until) {
          spdlog::warn(
              "poller: a claim waited {}ms for a job row another transaction holds; claims skip "
              "held rows for the next minute",
              config_.lock_timeout.count());
        }
        run.skip_locked_until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
        run.found_jobs = false;
        continue;
      }
      if (claim_wanted > 0) claim_was_cut(run, claim_wanted, statement_timed_out(e));
      // A claim this session sent may have committed without its answer (the session was cut as
      // it committed): its jobs would be running under this epoch, in no run of ours.
      if (run.session.pid != 0) {
        run.gaps.push_back(
            {run.last_claim_us, 0, run.session, std::chrono::steady_clock::now(), false});
      }
      run.session = {};
      run.receiver.reset();
      run.conn.reset();
      // The session's advisory locks ended with it: the keys are taken again before sleeping.
      run.wake_keys_held = false;
      run.drop_keys = false;
      run.found_jobs = false;
      if (run.stopping.load()) break;  // cut at the end of leadership: nothing to report
      if (observer_ != nullptr) observer_->database_error("poller");
      if (!run.reported) {
        spdlog::error("poller: {}; retrying with backoff", detail::failure_text(e));
        run.reported = true;
      }
      if (run.kept && !run_kept_here(run, in_job)) return true;
      wait(run, run.backoff.next());
    }
  }
  run.receiver.reset();
  run.conn.reset();
  return false;
}

}  // namespace baton::worker
