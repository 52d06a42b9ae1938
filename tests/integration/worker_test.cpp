// The worker runtime with a node in this process and a real PostgreSQL: claims sized to free
// threads, per-queue limits, revoke reaching running handlers, hung jobs, history pruning.
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "baton/detail/call_watch.h"
#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "baton/detail/registry.h"
#include "support/node_runner.h"
#include "support/proxy.h"
#include "support/schema_test.h"
#include "support/support.h"
#include "worker/completer.h"
#include "worker/executor.h"

namespace {

using namespace baton::test;
using baton::Client;
using baton::EnqueueOptions;
using baton::JobContext;
using baton::Node;

// Uses `cpu` of this thread's CPU time, however long that takes on a busy machine (bounded by a
// count, in case the clock does not move).
void spin_cpu(std::chrono::nanoseconds cpu) {
  timespec start{}, t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  for (int i = 0; i < 100'000'000; ++i) {
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    if ((t.tv_sec - start.tv_sec) * 1'000'000'000L + (t.tv_nsec - start.tv_nsec) > cpu.count())
      return;
  }
}

// The first attempt of job `id`, claimed by hand (epoch 1, claim token 1), failed with `error`:
// retry in a minute.
baton::detail::Failure retry_in_a_minute(std::int64_t id, std::string error) {
  return {.id = id,
          .epoch = 1,
          .token = 1,
          .attempt = 1,
          .error = std::move(error),
          .dead = false,
          .reason = "",
          .retry_delay_ms = 60'000};
}

// Counts what the completer and the executor report as fenced, and ignores the rest.
class FenceCounter : public baton::detail::JobObserver {
 public:
  std::atomic<std::size_t> fenced{0};
  std::atomic<int> completed{0};
  std::atomic<int> database_errors{0};
  void database_error(std::string_view) override { ++database_errors; }
  void job_started(std::string_view, std::string_view, double) override {}
  void job_finished(std::string_view, std::string_view, baton::detail::Outcome outcome, double,
                    double) override {
    if (outcome == baton::detail::Outcome::completed) ++completed;
  }
  void jobs_fenced(std::string_view, std::string_view, std::size_t n) override { fenced += n; }
  void jobs_released(std::size_t) override {}
  void pool_busy(int, int, int) override {}
  void claimed_waiting(int) override {}
  void completer_pending(std::size_t) override {}
  void claim_took(double, bool) override {}
  void claim_cut(baton::detail::ClaimCut) override {}
};

// How many times each job ran, for a handler on a test node.
struct RunsById {
  std::mutex m;
  std::map<std::int64_t, int> runs;
  void ran(const JobContext& ctx) {
    std::lock_guard lock(m);
    ++runs[ctx.job().id];
  }
  // Jobs that ran so far.
  std::size_t jobs() {
    std::lock_guard lock(m);
    return runs.size();
  }
  // `n` jobs ran, each once.
  void expect_each_once(std::size_t n) {
    std::lock_guard lock(m);
    EXPECT_EQ(runs.size(), n);
    for (const auto& [id, times] : runs)
      EXPECT_EQ(times, 1) << "job " << id << " ran " << times << " times";
  }
};

class Worker : public SchemaTest {
 protected:
  // One lock row, granted and held: the node leads.
  static constexpr const char* kLeading =
      "SELECT count(*) FROM locks WHERE epoch > 0 AND holder_pid IS NOT NULL";
  // Hands every row of jobs (claimed by hand, in id order) to `executor` as claimed jobs of
  // `type` (empty: each row's own), each under its claimed_epoch.
  void submit_rows(baton::worker::Executor& executor, const std::string& type) {
    pqxx::nontransaction tx(*db_);
    for (const auto& row : tx.exec("SELECT id, claimed_epoch, type FROM jobs ORDER BY id")) {
      baton::detail::ClaimedJob job;
      job.job.id = row[0].as<std::int64_t>();
      job.job.queue = "default";
      job.job.type = type.empty() ? row[2].as<std::string>() : type;
      job.job.attempt = 1;
      job.job.max_attempts = 10;
      job.job.epoch = row[1].as<std::int64_t>();
      executor.submit(std::move(job));
    }
  }
  // Inserts `n` jobs of `type` running under epoch 1 with claim token `claims`, as node "solo"
  // would have claimed them; returns their ids in order.
  std::vector<std::int64_t> running_jobs(int n, const std::string& type, int claims) {
    pqxx::nontransaction tx(*db_);
    std::vector<std::int64_t> ids;
    for (const auto& row : tx.exec_params(
             "INSERT INTO jobs (queue, type, state, attempts, claimed_epoch, claimed_by, "
             "claimed_at, first_started_at, claims) SELECT 'default', $1, 'running', 1, 1, "
             "'solo', now(), now(), $2 FROM generate_series(1, $3) RETURNING id",
             type, claims, n))
      ids.push_back(row[0].as<std::int64_t>());
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  // A trigger deferred to COMMIT on each row inserted into `table`: `body` (PL/pgSQL statements)
  // runs as the transaction that wrote the row commits.
  void at_commit_after_insert(const std::string& table, const std::string& name,
                              const std::string& body) {
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE FUNCTION " + name + "() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN " + body +
            " RETURN NULL; END $f$");
    tx.exec("CREATE CONSTRAINT TRIGGER " + name + " AFTER INSERT ON " + table +
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + name + "()");
  }
  // Three outcomes for jobs `ids[first..first+2]` (running under epoch 1, claim token 1): a
  // completion, a retry and a release.
  static void add_three_outcomes(baton::worker::Completer& completer,
                                 const std::vector<std::int64_t>& ids, std::size_t first) {
    completer.add(
        baton::detail::Completion{.id = ids[first], .epoch = 1, .token = 1, .run_seconds = 0.001});
    completer.add(retry_in_a_minute(ids[first + 1], "try again"));
    completer.add(baton::detail::Release{.id = ids[first + 2], .epoch = 1, .token = 1});
  }
  // Each of those three outcomes is written exactly once.
  void expect_three_written_once(const std::vector<std::int64_t>& ids, std::size_t first,
                                 const std::string& what) {
    const auto done = std::to_string(ids[first]), retried = std::to_string(ids[first + 1]),
               released = std::to_string(ids[first + 2]);
    EXPECT_EQ(
        count("SELECT count(*) FROM job_history WHERE outcome = 'completed' AND id = " + done), 1)
        << what << ": the completion was not written exactly once";
    EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND "
                    "jsonb_array_length(errors) = 1 AND id = " +
                    retried),
              1)
        << what << ": the retry was not written exactly once";
    EXPECT_EQ(
        count("SELECT count(*) FROM jobs WHERE state = 'available' AND attempts = 0 AND id = " +
              released),
        1)
        << what << ": the release was not written exactly once";
  }
  // One job of type "ledger", running under epoch 1, whose transactional handler writes its id
  // into the table ledger (created here). start() runs it on an executor of one thread whose
  // sessions reach the server through `proxy`; outcomes go to a completer of their own.
  struct LedgerRun {
    LedgerRun(const std::string& url, const std::string& schema)
        : proxy(url), completer({.url = url, .schema = schema}, &observer) {
      handlers.add("ledger", baton::TxHandler([schema](JobContext& ctx, pqxx::work& tx) {
                     tx.exec_params("INSERT INTO \"" + schema + "\".ledger VALUES ($1)",
                                    ctx.job().id);
                   }));
      completer.start();
    }
    baton::detail::HandlerRegistry handlers;
    Proxy proxy;
    FenceCounter observer;
    baton::worker::Completer completer;
    std::optional<baton::worker::Executor> executor;
  };
  std::unique_ptr<LedgerRun> ledger_run() {
    running_jobs(1, "ledger", 0);
    pqxx::nontransaction(*db_).exec("CREATE TABLE ledger (job bigint)");
    auto run = std::make_unique<LedgerRun>(database_url(), schema_);
    run->executor.emplace(
        baton::worker::ExecutorConfig{
            .connect = {.url = run->proxy.url_through(database_url()), .schema = schema_},
            .threads = 1,
            .node_id = "solo",
            .retry = {}},
        run->handlers, run->completer, &run->observer, [] {});
    run->executor->accept(1);
    return run;
  }
  // Runs the ledger job until the executor is idle, then stops it and waits for the outcome.
  void run_ledger_job(LedgerRun& run) {
    submit_rows(*run.executor, "ledger");
    ASSERT_TRUE(run.executor->wait_idle(30s));
    run.executor.reset();
    ASSERT_TRUE(run.completer.wait_flushed(20s));
  }
  // The ledger job ran once and is done: its write is in, it is in the history once, completed
  // and never counted as fenced.
  void expect_ledger_done_once(const LedgerRun& run) {
    EXPECT_EQ(count("SELECT count(*) FROM ledger"), 1);
    EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE outcome = 'completed' AND errors IS "
                    "NULL"),
              1);
    EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
    EXPECT_EQ(run.observer.completed.load(), 1);
    EXPECT_EQ(run.observer.fenced.load(), 0u) << "the job's failure was written after it committed";
  }
  // A node "solo" that handles `noop` and polls once a minute: asleep, it waits for a NOTIFY.
  // `batch_size`: 0 for the default; `claim_gather`: none for the default.
  std::unique_ptr<RunningNode> sleepy_noop_leader(
      int batch_size = 0, std::optional<std::chrono::milliseconds> claim_gather = {}) {
    auto config = test_config(schema_, "solo");
    config.poll_interval = std::chrono::minutes(1);
    config.metrics_listen = "127.0.0.1:0";
    if (batch_size > 0) config.batch_size = batch_size;
    if (claim_gather) config.claim_gather = *claim_gather;
    return std::make_unique<RunningNode>(
        config, [](Node& node) { node.handle("noop", [](JobContext&) {}); });
  }
  // Claims of the finished jobs of `type` (a claim's jobs share their started_at), and how many
  // of them came 90 ms or more after the claim before: a gather of 100 ms between them.
  std::pair<long long, long long> claims_and_late_ones(const std::string& type = "noop") {
    const std::string claims =
        "SELECT DISTINCT started_at AS t FROM job_history WHERE type = '" + type + "'";
    return {count("SELECT count(*) FROM (" + claims + ") c"),
            count("SELECT count(*) FROM (SELECT t - lag(t) OVER (ORDER BY t) AS gap FROM (" +
                  claims + ") c) g WHERE gap >= interval '90 milliseconds'")};
  }
  // Ends the server session `pid` (as a restart or a failover would) and waits until it is gone.
  bool end_session(long long pid) {
    const auto id = std::to_string(pid);
    count("SELECT pg_catalog.pg_terminate_backend(" + id + ")::int");
    return wait_count("SELECT count(*) FROM pg_stat_activity WHERE pid = " + id, 0, 10s);
  }
  // The session of node `node` that holds an advisory lock exclusively, but for the election's:
  // its poller's, asleep with the wake keys (0: none).
  std::string wake_key_holder(const std::string& node) const {
    return "SELECT coalesce(min(l.pid), 0) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
           "WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted "
           "AND a.application_name = '" +
           baton::detail::node_application_name(node, schema_) +
           "' AND l.pid IS DISTINCT FROM (SELECT holder_pid FROM locks)";
  }
  // Runs every row of jobs (submit_rows) on an executor of `threads` that accepts `epoch`, with
  // `handlers`, until it is idle and the completer has written every outcome.
  void run_rows(const baton::detail::HandlerRegistry& handlers, int threads, std::int64_t epoch,
                const std::string& type, std::chrono::seconds timeout) {
    const baton::detail::ConnectOptions connect{.url = database_url(), .schema = schema_};
    baton::worker::Completer completer(connect, nullptr);
    completer.start();
    {
      baton::worker::Executor executor(
          {.connect = connect, .threads = threads, .node_id = "solo", .retry = {}}, handlers,
          completer, nullptr, [] {});
      executor.accept(epoch);
      submit_rows(executor, type);
      ASSERT_TRUE(executor.wait_idle(timeout));
    }
    ASSERT_TRUE(completer.wait_flushed(20s));
    completer.stop(1s);
  }
};

TEST_F(Worker, SlowJobsAreNotClaimedBeforeAThreadCanStartThem) {
  // The poller buffers about 100 ms of work beyond the free threads. Had it claimed more than the
  // pool could start, the extra jobs would sit claimed for a whole job duration (300 ms) before a
  // thread took them. Each handler records when it started; the database recorded when the job
  // was claimed (same host, same clock).
  std::mutex m;
  std::map<std::int64_t, std::chrono::system_clock::time_point> started;
  auto config = test_config(schema_, "solo");
  config.threads = 2;
  config.batch_size = 100;
  RunningNode n(config, [&](Node& node) {
    node.handle("nap", [&](JobContext& ctx) {
      {
        std::lock_guard lock(m);
        started[ctx.job().id] = std::chrono::system_clock::now();
      }
      std::this_thread::sleep_for(300ms);
    });
  });
  Client(database_url(), schema_).enqueue_copies("nap", {}, 8);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 8; }, 30s));
  pqxx::nontransaction tx(*db_);
  for (const auto& row :
       tx.exec("SELECT id, extract(epoch FROM started_at)::float8 FROM job_history")) {
    const auto claimed = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(row[1].as<double>())));
    std::lock_guard lock(m);
    const auto waited = started.at(row[0].as<std::int64_t>()) - claimed;
    EXPECT_LT(waited, 150ms) << "job " << row[0].c_str() << " waited "
                             << std::chrono::duration<double, std::milli>(waited).count()
                             << " ms between its claim and its start";
  }
}

TEST_F(Worker, UnderABacklogEveryClaimTakesAWholeBatch) {
  // Once the jobs' run time is known, the poller keeps a buffer of claimed jobs and claims again
  // when half of it is left; the room then left must hold a whole batch, or every claim of a
  // drain takes half of one. Each claim stamps its jobs with one claim time. (The buffer's other
  // bounds stay out of the way: 100 ms of two threads' work is 200 jobs while a no-op job runs
  // under 1 ms, and the payloads are empty.)
  auto config = test_config(schema_, "solo");
  config.threads = 2;
  config.batch_size = 100;
  Client(database_url(), schema_).enqueue_copies("noop", {}, 3000);
  RunningNode n(config, [](Node& node) { node.handle("noop", [](JobContext&) {}); });
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 3000; }, 60s));
  // The first claims, before a run time is known, take one job per free thread; the last takes
  // what is left.
  EXPECT_EQ(count("SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY n) FROM "
                  "(SELECT count(*) AS n FROM job_history GROUP BY started_at) c"),
            100)
      << "the median claim took fewer jobs than a batch";
}

TEST_F(Worker, EveryEnqueueWakesTheLeaderWithoutWaitingForAPoll) {
  // With a one-minute poll interval only the NOTIFY can start these jobs within the deadline.
  // (The poller also checks for a notification that a claim read off the socket while it ran;
  // that window is one round trip, too narrow to hit on purpose here.)
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  RunningNode n(config, [](Node& node) { node.handle("noop", [](JobContext&) {}); });
  ASSERT_TRUE(
      wait_for([&] { return count("SELECT count(*) FROM locks WHERE epoch > 0") == 1; }, 20s));
  Client client(database_url(), schema_);
  for (int i = 0; i < 300; ++i) {
    const auto id = client.enqueue("noop", {{"i", i}});
    ASSERT_TRUE(wait_for(
        [&] {
          return count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id)) == 1;
        },
        10s, 1ms))
        << "job " << i << " waited for the poll interval: its NOTIFY was lost";
  }
}

TEST_F(Worker, AStreamOfJobsIsClaimedAGatherAtATimeRatherThanAFewJobsPerRoundTrip) {
  // While jobs stream in, the leader waits claim_gather between claims, so that each claim takes
  // what arrived meanwhile. A stream is what comes faster than the leader's claims: four
  // producers enqueue as fast as they can for a second. (One was not enough under a sanitizer:
  // its enqueues came about as often as the leader's claims, each claim found a job or none,
  // and that is jobs coming one at a time, which never gather.) Claims that went again at once
  // would take a few jobs each (what arrived during a round trip); gathered for 100 ms, the
  // second's ten or so claims take many each. A claim's jobs share their started_at (the
  // claim's transaction time).
  const auto n = sleepy_noop_leader(0, 100ms);
  ASSERT_TRUE(wait_for([&] { return count(kLeading) == 1; }, 20s));
  constexpr int kProducers = 4;
  std::atomic<int> produced{0};
  std::vector<std::thread> producers;
  const auto until = std::chrono::steady_clock::now() + 1s;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      Client client(database_url(), schema_);
      for (int i = 0; i < 100'000 && std::chrono::steady_clock::now() < until; ++i) {
        client.enqueue("noop", {{"p", p}, {"i", i}});
        produced.fetch_add(1);
      }
    });
  }
  for (auto& t : producers)
    t.join();
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == produced; }, 30s))
      << "a job of the stream waited for the poll interval";
  const auto claims = count("SELECT count(DISTINCT started_at) FROM job_history");
  EXPECT_GE(produced, 10 * claims)
      << produced << " jobs took " << claims << " claims, of (in time order) "
      << pqxx::nontransaction(*db_)
             .exec1(
                 "SELECT string_agg(n::text, ' ' ORDER BY t) FROM (SELECT started_at AS t, "
                 "count(*) AS n FROM job_history GROUP BY 1) c")[0]
             .as<std::string>();
  // The operator sees the gathers: each waited its 100 ms (nothing here ends one early; counted
  // in seconds, not in milliseconds), and each followed a claim that found jobs.
  const auto page = scrape(n->node().metrics_address());
  const double gathers = metric_sum(page, "baton_claim_gathers_total");
  EXPECT_GE(gathers, 1) << page;
  const double seconds = metric_sum(page, "baton_claim_gather_seconds_total");
  EXPECT_GE(seconds, 0.09 * gathers) << page;
  EXPECT_LE(seconds, 1.0 * gathers) << page;
  EXPECT_LE(gathers, metric_sum(page, "baton_claim_seconds_count{result=\"jobs\"}")) << page;
}

TEST_F(Worker, ABacklogIsClaimedBackToBackWithoutTheGather) {
  // Claims that come back full leave more waiting: the next goes at once, not after the gather.
  // 500 queued jobs, ten a claim: gathering between full claims, they would be 100 ms apart.
  Client(database_url(), schema_).enqueue_copies("noop", {}, 500);
  const auto n = sleepy_noop_leader(10, 100ms);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 500; }, 60s));
  const auto [claims, late] = claims_and_late_ones();
  ASSERT_GE(claims, 50);
  EXPECT_LE(late * 10, claims) << late << " of " << claims << " claims came after a gather";
  const auto page = scrape(n->node().metrics_address());
  EXPECT_LE(metric_sum(page, "baton_claim_gathers_total") * 10, claims) << page;
}

TEST_F(Worker, OrderedPartitionsGoOnAsTheirJobsEndWithoutTheGather) {
  // An ordered partition runs one job at a time, so claims of partitioned jobs come back short
  // while the rest of each partition waits: the next claim must not wait for the gather.
  // Eight partitions of 40 jobs, gathered for 100 ms a claim, would take seconds. (Keys that
  // share a partition run in turn: the test needs more than one partition, not all eight.)
  Client client(database_url(), schema_);
  client.declare_ordered_queue("default", 64);
  EnqueueOptions in;
  for (int i = 0; i < 40; ++i) {
    for (int p = 0; p < 8; ++p) {
      in.partition_key = "p" + std::to_string(p);
      client.enqueue("noop", {{"i", i}}, in);
    }
  }
  const auto n = sleepy_noop_leader(0, 100ms);
  // Each partition's next job is claimable once the one before is written off: the completer
  // wakes the leader then, or it would wait for its poll (a minute here).
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 320; }, 30s))
      << count("SELECT count(*) FROM job_history") << " of 320 jobs ran";
  const auto [claims, late] = claims_and_late_ones();
  ASSERT_GE(claims, 40);
  EXPECT_LE(late * 10, claims) << late << " of " << claims << " claims came after a gather";
}

TEST_F(Worker, AQueueAtItsLimitBesideAStreamIsNotHeldBackByTheGather) {
  // A queue limited to one job at a time has a backlog of 5 ms jobs, and another queue streams
  // in. The stream's claims come back short, but the limited queue's next job waits for a
  // place, not for more arrivals: a gather of 100 ms after a round that found its queue at the
  // limit would hold each of its jobs back.
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  config.claim_gather = 100ms;
  config.queue_concurrency = {{"mail", 1}};
  EnqueueOptions mail;
  mail.queue = "mail";
  Client client(database_url(), schema_);
  client.enqueue_copies("send", {}, 60, mail);
  RunningNode n(config, [](Node& node) {
    node.handle("noop", [](JobContext&) {});
    node.handle("send", [](JobContext&) { std::this_thread::sleep_for(5ms); });
  });
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    Client own(database_url(), schema_);
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!stop.load() && std::chrono::steady_clock::now() < until)
      own.enqueue("noop", {});
  });
  const bool drained = wait_for(
      [&] { return count("SELECT count(*) FROM job_history WHERE type = 'send'") == 60; }, 30s);
  stop = true;
  producer.join();
  ASSERT_TRUE(drained) << count("SELECT count(*) FROM job_history WHERE type = 'send'")
                       << " of 60 limited jobs ran";
  const auto [claims, late] = claims_and_late_ones("send");
  EXPECT_LE(late * 10, claims) << late << " of the limited queue's " << claims
                               << " claims came after a gather";
}

TEST_F(Worker, AJobAfterAQuietSpellIsNotHeldBackByTheGather) {
  // The gather is for streams (two claims in a row found jobs). Jobs enqueued one at a time, a
  // few milliseconds after the one before ran, each find the leader asleep and start at once:
  // a leader that gathered after every claim that found a job would hold each one back for
  // most of its 100 ms.
  const auto n = sleepy_noop_leader(0, 100ms);
  ASSERT_TRUE(wait_for([&] { return count(kLeading) == 1; }, 20s));
  Client client(database_url(), schema_);
  std::vector<double> ms;
  for (int i = 0; i < 15; ++i) {
    std::this_thread::sleep_for(5ms);  // the quiet spell, not a wait for a state
    const auto id = client.enqueue("noop", {{"i", i}});
    const auto enqueued = std::chrono::steady_clock::now();
    ASSERT_TRUE(wait_for(
        [&] {
          return count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id)) == 1;
        },
        10s, 1ms));
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - enqueued)
            .count());
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[ms.size() / 2], 50.0)
      << "the median job waited " << ms[ms.size() / 2] << " ms from its enqueue to its history row";
}

TEST_F(Worker, ProducersThatDoNotNotifyNeverStrandAJobWhileTheLeaderSleeps) {
  // Producers notify only while the leader may sleep. Four producers enqueue in transactions of
  // their own, some held open a moment after the enqueue, with short gaps: the leader goes from
  // work to sleep and back many times while producers are between their enqueue and their
  // commit. With a one-minute poll interval, a job whose producer skipped the NOTIFY just as the
  // leader fell asleep would wait a minute; every job must finish within seconds.
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  RunningNode n(config, [](Node& node) { node.handle("noop", [](JobContext&) {}); });
  ASSERT_TRUE(
      wait_for([&] { return count("SELECT count(*) FROM locks WHERE epoch > 0") == 1; }, 20s));
  constexpr int kProducers = 4;
  constexpr int kEach = 150;
  std::vector<std::thread> producers;
  std::atomic<int> failures{0};
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      try {
        pqxx::connection conn(database_url());
        for (int i = 0; i < kEach; ++i) {
          pqxx::work tx(conn);
          baton::enqueue_in(tx, {baton::NewJob{"noop", {{"p", p}, {"i", i}}, {}}},
                            baton::ClientOptions{.schema = schema_});
          if (i % 3 == p % 3) std::this_thread::sleep_for(std::chrono::milliseconds(i % 4));
          tx.commit();
          if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2 + i % 7));
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "producer " << p << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : producers)
    t.join();
  ASSERT_EQ(failures.load(), 0);
  EXPECT_TRUE(wait_count("SELECT count(*) FROM job_history", kProducers * kEach, 15s))
      << count("SELECT count(*) FROM jobs") << " jobs still queued: a wake-up was lost";
  // And once all is done, a single enqueue still wakes the sleeping leader at once.
  const auto id = Client(database_url(), schema_).enqueue("noop", {{"last", true}});
  EXPECT_TRUE(
      wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id), 1, 10s));
}

TEST_F(Worker, AJobQueuedWhileAnotherRunsStartsWithoutWaitingForThePoll) {
  // The leader wakes for a long job and claims it: that round found fewer jobs than it had room
  // for. It must not then sleep without the wake keys, or the next producer (which finds the
  // keys free) would not notify, and its job would wait for the poll interval (a minute here)
  // or for the long job to end.
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  std::atomic<bool> long_started{false}, release{false};
  RunningNode n(config, [&](Node& node) {
    node.handle("long", [&](JobContext&) {
      long_started = true;
      for (int i = 0; i < 3000 && !release.load(); ++i)
        std::this_thread::sleep_for(10ms);
    });
    node.handle("noop", [](JobContext&) {});
  });
  ASSERT_TRUE(
      wait_for([&] { return count("SELECT count(*) FROM locks WHERE epoch > 0") == 1; }, 20s));
  Client client(database_url(), schema_);
  for (int round = 0; round < 5; ++round) {
    long_started = false;
    release = false;
    client.enqueue("long", {{"round", round}});
    ASSERT_TRUE(wait_for([&] { return long_started.load(); }, 10s));
    // Give the poller time to go to sleep after the round that claimed the long job.
    std::this_thread::sleep_for(50ms);
    const auto id = client.enqueue("noop", {{"round", round}});
    EXPECT_TRUE(
        wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id), 1, 5s))
        << "round " << round << ": the job waited while the long one ran";
    release = true;
    ASSERT_TRUE(wait_count("SELECT count(*) FROM jobs", 0, 10s));
  }
}

TEST_F(Worker, AJobTheClaimingThreadRunsDoesNotHoldUpTheNextGrant) {
  // Woken from sleep, the claiming thread runs the first job it claims itself. A revoke while
  // that job runs (a handler that ignores its cancellation) must not hold up the claims of the
  // next grant: the thread ends after its job, and nothing in the hand-over waits for it.
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  std::atomic<bool> started{false}, release{false};
  RunningNode n(config, [&](Node& node) {
    node.handle("stubborn", [&](JobContext&) {
      started = true;
      const auto until = std::chrono::steady_clock::now() + 20s;
      while (!release.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(5ms);
    });
    node.handle("noop", [](JobContext&) {});
  });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  const auto epoch = count("SELECT epoch FROM locks");
  Client client(database_url(), schema_);
  client.enqueue("stubborn", {});
  ASSERT_TRUE(wait_for([&] { return started.load(); }, 10s));
  // Cut the election session: the node loses leadership and, alone, wins it back.
  count("SELECT count(*) FILTER (WHERE pg_terminate_backend(holder_pid)) FROM locks");
  ASSERT_TRUE(wait_for(
      [&] {
        return count("SELECT count(*) FROM locks WHERE epoch > " + std::to_string(epoch) +
                     " AND holder_pid IS NOT NULL") == 1;
      },
      20s));
  const auto id = client.enqueue("noop", {});
  EXPECT_TRUE(
      wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id), 1, 5s))
      << "the new epoch's claims waited for the job the old one's claiming thread ran";
  EXPECT_FALSE(release.load());
  release = true;
}

TEST_F(Worker, TheEndOfALongJobTheClaimingThreadRanLetsTheNextOneStart) {
  // One thread, and no run time known yet (so no buffer): while the claiming thread runs the job
  // that woke it, the other takes the turn after 1 ms, finds no free place and sleeps. The job's
  // end must wake it, or the next job waits for the poll interval (a minute here).
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  config.threads = 1;
  std::atomic<int> started{0};
  RunningNode n(config, [&](Node& node) {
    node.handle("slow", [&](JobContext&) {
      ++started;
      std::this_thread::sleep_for(300ms);
    });
  });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  Client client(database_url(), schema_);
  client.enqueue("slow", {{"n", 1}});
  ASSERT_TRUE(wait_for([&] { return started.load() == 1; }, 10s));
  const auto id = client.enqueue("slow", {{"n", 2}});
  EXPECT_TRUE(
      wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id), 1, 5s))
      << "the second job waited for the poll interval after the first ended";
}

TEST_F(Worker, AJobKeptByARoundThatAShutdownCutGoesBackToTheQueue) {
  // A round claims a limited queue first: woken from sleep, the claiming thread keeps that job
  // to run once the round ends. Here the round's next claim (the other queues') is slow (a
  // trigger sleeps in it) and a shutdown cuts it. The kept job must go back to the queue, as
  // the claimed jobs that had not started do: run then, it would hold up the shutdown (and a
  // hand-over, under the consumer's lock) for as long as it runs.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.queue = 'default' AND OLD.state = 'available' AND NEW.state = 'running' THEN "
        "PERFORM pg_catalog.pg_sleep(5); END IF; RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION "
        "slow_claim()");
  }
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  config.queue_concurrency = {{"limited", 1}};
  // A claim is cut at the lease's end: on the default 500 ms lease the slow claim would be cut
  // before the shutdown, while the node still claims, and the kept job would then rightly run.
  config.lock_ttl = std::chrono::seconds(10);
  std::atomic<bool> started{false};
  auto node = std::make_unique<RunningNode>(config, [&](Node& n) {
    n.handle("kept", [&](JobContext&) {
      started = true;
      std::this_thread::sleep_for(2s);
    });
    n.handle("other", [](JobContext&) {});
  });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  // Asleep, holding the wake keys: the enqueue below wakes it, and it keeps the first job.
  ASSERT_TRUE(wait_for([&] { return count(wake_key_holder("solo")) != 0; }, 20s));
  {
    pqxx::connection conn(database_url());
    pqxx::work tx(conn);
    baton::enqueue_in(tx,
                      {baton::NewJob{"kept", {}, EnqueueOptions{.queue = "limited"}},
                       baton::NewJob{"other", {}, {}}},
                      baton::ClientOptions{.schema = schema_});
    tx.commit();
  }
  // The round's second claim is in the trigger's sleep (this node's session: a claim cut in
  // another test, or in an earlier run of this one, may still sleep on the server).
  ASSERT_TRUE(wait_for(
      [&] {
        return count(
                   "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND "
                   "application_name = '" +
                   baton::detail::node_application_name("solo", schema_) + "'") == 1;
      },
      10s));
  node.reset();
  EXPECT_FALSE(started.load()) << "the kept job ran during the shutdown";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE type = 'kept' AND state = 'available'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs") + count("SELECT count(*) FROM job_history"), 2);
}

TEST_F(Worker, ASleepingLeaderWhoseClaimSessionWasCutStillWakesForAnEnqueue) {
  // Asleep, the poller holds the wake keys on its claim session, and the keys end with that
  // session. Once it has reconnected it must take them again before it sleeps: without them,
  // producers find the keys free and do not notify, and a job waits for the poll interval (a
  // minute here).
  const auto n = sleepy_noop_leader();
  const std::string key_holder = wake_key_holder("solo");
  Client client(database_url(), schema_);
  for (int round = 0; round < 3; ++round) {
    std::int64_t pid = 0;
    ASSERT_TRUE(wait_for([&] { return (pid = count(key_holder)) != 0; }, 20s))
        << "round " << round << ": the poller does not sleep holding the wake keys";
    count("SELECT count(*) FROM pg_stat_activity WHERE pg_terminate_backend(" +
          std::to_string(pid) + ")");
    ASSERT_TRUE(wait_for(
        [&] {
          const auto now = count(key_holder);
          return now != 0 && now != pid;
        },
        10s))
        << "round " << round << ": reconnected, the poller sleeps without the wake keys";
    const auto id = client.enqueue("noop", {{"round", round}});
    EXPECT_TRUE(
        wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id), 1, 5s))
        << "round " << round << ": the job waited for the poll interval";
  }
}

TEST_F(Worker, AJobThatSortsFirstOvertakesABacklogThatIsDraining) {
  // While claims come back full, the next one starts after the last job claimed; the claims that
  // still start from the beginning must find a job queued meanwhile with a higher priority, long
  // before the backlog ends.
  auto config = test_config(schema_, "solo");
  config.threads = 4;
  config.batch_size = 20;
  std::mutex m;
  std::vector<std::string> order;  // what started, in order
  RunningNode n(config, [&](Node& node) {
    node.handle("slow", [&](JobContext&) {
      {
        std::lock_guard lock(m);
        order.emplace_back("slow");
      }
      std::this_thread::sleep_for(2ms);
    });
    node.handle("urgent", [&](JobContext&) {
      std::lock_guard lock(m);
      order.emplace_back("urgent");
    });
  });
  // Queued with about 3,800 jobs left, it must start before the last 1,000: 2,800 jobs x 2 ms /
  // 4 threads = 1.4 s, more than the longest wait for a claim from the beginning (1 s,
  // worker/claim_cursor.h).
  constexpr int kBacklog = 4000;
  Client client(database_url(), schema_);
  client.enqueue_copies("slow", {}, kBacklog);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") >= 200; }, 30s));
  EnqueueOptions first;
  first.priority = -10;
  client.enqueue("urgent", {}, first);
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", kBacklog + 1, 60s));
  std::lock_guard lock(m);
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kBacklog + 1));
  const auto at = std::find(order.begin(), order.end(), "urgent") - order.begin();
  EXPECT_LT(at, kBacklog - 1000) << "the job first in claim order waited for the backlog";
}

TEST_F(Worker, AJobThatSortsFirstOvertakesAStreamThatKeepsTheQueueShort) {
  // Producers feed the queue about as fast as it is claimed, and a session holds a wake key
  // shared all along, so the leader never sleeps on the keys: it polls. A job queued meanwhile
  // with a higher priority must be claimed while the stream goes on (a claim that started after
  // the last job claimed, every time, would never reach it).
  auto config = test_config(schema_, "solo");
  config.threads = 2;
  pqxx::connection stranger(database_url());
  ASSERT_TRUE(pqxx::nontransaction(stranger)
                  .exec_params("SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))",
                               schema_ + "_jobs/*")[0][0]
                  .as<bool>());
  std::atomic<bool> urgent_ran{false};
  RunningNode n(config, [&](Node& node) {
    node.handle("stream", [](JobContext&) { std::this_thread::sleep_for(1ms); });
    node.handle("urgent", [&](JobContext&) { urgent_ran = true; });
  });
  Client client(database_url(), schema_);
  std::atomic<bool> stop{false};
  std::atomic<int> streamed{0};
  std::thread producer([&] {
    Client own(database_url(), schema_);
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (!stop.load() && std::chrono::steady_clock::now() < until) {
      own.enqueue("stream", {});
      ++streamed;
      std::this_thread::sleep_for(500us);
    }
  });
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") >= 200; }, 30s));
  EnqueueOptions first;
  first.priority = -10;
  const auto urgent = client.enqueue("urgent", {}, first);
  const bool ran = wait_for([&] { return urgent_ran.load(); }, 30s);
  const int during = streamed.load();
  stop = true;
  producer.join();
  EXPECT_TRUE(ran) << "the job first in claim order waited 30 s behind a stream of " << during;
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(urgent)), 1);
}

TEST_F(Worker, AJobThatSortsFirstWakesASleepingLeaderRightAfterAClaim) {
  // The leader claimed a job and went to sleep holding its wake keys, well within the period
  // between periodic claims from the beginning (worker/claim_cursor.h). A job that sorts before
  // the one it claimed wakes it, and the claim it wakes for must find it: started after the last
  // job claimed, it would not, and the job would wait for the poll interval (a minute here).
  // Claims of one job: the round's claim comes back full, so it leaves a cursor after its job.
  const auto n = sleepy_noop_leader(1);
  const std::string key_holder = wake_key_holder("solo");
  Client client(database_url(), schema_);
  EnqueueOptions first;
  // Checked every millisecond: the job that sorts first must come well within the 50 ms after
  // the round's first claim, for a claim after the cursor to miss it.
  auto done = [&](std::int64_t id) {
    return count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id)) == 1;
  };
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(wait_for([&] { return count(key_holder) != 0; }, 20s))
        << "round " << round << ": the poller does not sleep holding the wake keys";
    first.priority = -round;
    const auto id = client.enqueue("noop", {{"round", round}}, first);
    ASSERT_TRUE(wait_for([&] { return done(id); }, 5s, 1ms));
    // Asleep again, its cursor after that job: the next sorts first.
    ASSERT_TRUE(wait_for([&] { return count(key_holder) != 0; }, 20s, 1ms));
    first.priority = -round - 100;
    const auto ahead = client.enqueue("noop", {{"round", round}}, first);
    EXPECT_TRUE(wait_for([&] { return done(ahead); }, 5s))
        << "round " << round << ": the job that sorts first waited for the poll interval";
  }
}

TEST_F(Worker, ASessionHoldingTheWakeKeysCannotStallTheQueue) {
  // A stranger that holds a wake key shared keeps the leader from sleeping on it (the leader
  // polls instead); one that holds it exclusively makes every producer notify. Neither may leave
  // a job waiting for the one-minute poll interval.
  auto config = test_config(schema_, "solo");
  config.poll_interval = std::chrono::minutes(1);
  RunningNode n(config, [](Node& node) { node.handle("noop", [](JobContext&) {}); });
  ASSERT_TRUE(
      wait_for([&] { return count("SELECT count(*) FROM locks WHERE epoch > 0") == 1; }, 20s));
  pqxx::connection stranger(database_url());
  pqxx::nontransaction st(stranger);
  Client client(database_url(), schema_);
  const std::string key = "hashtextextended(" + st.quote(schema_ + "_jobs/*") + ", 0)";
  for (const char* hold : {"pg_try_advisory_lock_shared", "pg_try_advisory_lock"}) {
    SCOPED_TRACE(hold);
    // The sleeping leader holds the key exclusively; a job wakes it and it lets go.
    ASSERT_TRUE(wait_for(
        [&] {
          client.enqueue("noop", {{"waking", true}});
          return st.exec(std::string("SELECT ") + hold + "(" + key + ")")[0][0].as<bool>();
        },
        10s, 1ms));
    for (int i = 0; i < 20; ++i) {
      const auto id = client.enqueue("noop", {{"i", i}});
      ASSERT_TRUE(
          wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(id), 1, 10s))
          << "job " << i << " waits for the poll interval";
    }
    st.exec("SELECT pg_advisory_unlock_all()");
  }
}

TEST_F(Worker, ClaimedJobsThatHaveNotStartedAreReleasedWhenTheirEpochEnds) {
  // An executor that accepts epoch 2 gets a job claimed under epoch 1 (claimed before a revoke
  // and still waiting for a thread): it must not run, and must go back with its attempt.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO jobs (queue, type, state, attempts, claimed_epoch, claimed_by, "
        "claimed_at, first_started_at) VALUES ('default', 'count', 'running', 1, 1, 'solo', "
        "now(), now()), ('default', 'count', 'running', 1, 2, 'solo', now(), now())");
  }
  std::atomic<int> ran{0};
  baton::detail::HandlerRegistry handlers;
  handlers.add("count", baton::Handler([&](JobContext&) { ++ran; }));
  run_rows(handlers, 2, 2, "count", 10s);
  if (HasFatalFailure()) return;
  EXPECT_EQ(ran.load(), 1) << "only the job of the accepted epoch runs";
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE epoch = 2"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND attempts = 0 "
                  "AND first_started_at IS NULL"),
            1);
}

TEST_F(Worker, AJobWhoseLeaseRanOutBeforeItsTurnDoesNotStartEvenBeforeTheRevoke) {
  // A node paused past its lease wakes with its epoch still accepted (the revoke has not come
  // yet): the lease, checked as each job starts, must keep the jobs still waiting from starting.
  // The run let start has a started_at() read before the lease ended.
  const auto ids = running_jobs(2, "hold", 0);
  std::atomic<bool> lease_ok{true};
  std::mutex m;
  std::condition_variable cv;
  bool first_started = false, go = false;
  std::vector<std::chrono::system_clock::time_point> started_at;
  baton::detail::HandlerRegistry handlers;
  handlers.add("hold", baton::Handler([&](JobContext& ctx) {
                 std::unique_lock lock(m);
                 started_at.push_back(ctx.started_at());
                 first_started = true;
                 cv.notify_all();
                 cv.wait_for(lock, 10s, [&] { return go; });  // the first run holds the thread
               }));
  const baton::detail::ConnectOptions connect{.url = database_url(), .schema = schema_};
  baton::worker::Completer completer(connect, nullptr);
  completer.start();
  std::chrono::system_clock::time_point lease_end;
  {
    baton::worker::Executor executor(
        {.connect = connect, .threads = 1, .node_id = "solo", .retry = {}}, handlers, completer,
        nullptr, [] {}, [&](std::int64_t epoch) { return epoch == 1 && lease_ok.load(); });
    executor.accept(1);
    submit_rows(executor, "hold");
    {
      std::unique_lock lock(m);
      ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return first_started; }));
      lease_end = std::chrono::system_clock::now();
      lease_ok = false;
      go = true;
    }
    cv.notify_all();
    ASSERT_TRUE(executor.wait_idle(10s));
    EXPECT_EQ(executor.accepted_epochs(), 1) << "the test meant the epoch to stay accepted";
  }
  ASSERT_TRUE(completer.wait_flushed(10s));
  completer.stop(1s);
  ASSERT_EQ(started_at.size(), 1u) << "a job started after its lease ran out";
  EXPECT_LE(started_at[0], lease_end);
  EXPECT_GT(started_at[0], lease_end - 10s);
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(ids[0])), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND attempts = 0 AND id = " +
                  std::to_string(ids[1])),
            1)
      << "the job that was not let start did not go back with its attempt";
}

TEST_F(Worker, TheShardsOfANodeTakeTurnsToStartTheirClaimedJobs) {
  // A node busy with one shard's jobs wins another shard: that shard's first job starts next,
  // not behind everything buffered for the first one.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO jobs (queue, type, state, attempts, claimed_epoch, claimed_by, claimed_at, "
        "first_started_at) SELECT 'default', 'order', 'running', 1, CASE WHEN i <= 10 THEN 1 "
        "ELSE 2 END, 'solo', now(), now() FROM generate_series(1, 12) i");
  }
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::int64_t> epochs;  // of the runs, in start order
  baton::detail::HandlerRegistry handlers;
  handlers.add("order", baton::Handler([&](JobContext& ctx) {
                 std::unique_lock lock(m);
                 epochs.push_back(ctx.job().epoch);
                 cv.wait_for(lock, 10s, [&] { return go; });  // the first run holds the thread
               }));
  const baton::detail::ConnectOptions connect{.url = database_url(), .schema = schema_};
  baton::worker::Completer completer(connect, nullptr);
  completer.start();
  {
    baton::worker::Executor executor(
        {.connect = connect, .threads = 1, .node_id = "solo", .retry = {}}, handlers, completer,
        nullptr, [] {});
    executor.accept(1);
    executor.accept(2);
    submit_rows(executor, "order");
    EXPECT_EQ(executor.in_flight(1), 10);
    EXPECT_EQ(executor.in_flight(2), 2);
    EXPECT_EQ(executor.accepted_epochs(), 2);
    {
      std::lock_guard lock(m);
      go = true;
    }
    cv.notify_all();
    ASSERT_TRUE(executor.wait_idle(10s));
    EXPECT_EQ(executor.in_flight(1), 0);
  }
  ASSERT_TRUE(completer.wait_flushed(10s));
  completer.stop(1s);
  ASSERT_EQ(epochs.size(), 12u);
  EXPECT_EQ(epochs[0], 1);
  EXPECT_EQ(epochs[1], 2) << "the second shard's first job waited behind the first shard's";
  EXPECT_EQ(epochs[2], 1);
  EXPECT_EQ(epochs[3], 2);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 12);
}

TEST_F(Worker, AFailureRefusedAsItWasIsKeptWhenTheConnectionIsLostWritingItsSafeForm) {
  // The database refuses a failure's text as it was; the completer writes it again in a form
  // that cannot be refused, and the connection is lost during that write. The outcome must be
  // written on the next connection, not dropped (the job would stay running until a rescue, and
  // run again).
  std::int64_t id = 0;
  {
    pqxx::nontransaction tx(*db_);
    id = tx.exec(
               "INSERT INTO jobs (queue, type, state, attempts, claimed_epoch, claimed_by, "
               "claimed_at, first_started_at, claims) VALUES ('default', 't', 'running', 1, 1, "
               "'solo', now(), now(), 1) RETURNING id")[0][0]
             .as<std::int64_t>();
    tx.exec("CREATE SEQUENCE safe_writes");
    tx.exec(R"sql(
      CREATE FUNCTION refuse_then_cut() RETURNS trigger LANGUAGE plpgsql AS $f$
      BEGIN
        IF NEW.last_error LIKE 'the outcome could not be recorded as it was%' THEN
          -- The first write of the safe form loses its connection.
          IF nextval('safe_writes') = 1 THEN
            PERFORM pg_terminate_backend(pg_backend_pid());
            PERFORM pg_sleep(5);
          END IF;
        ELSIF NEW.last_error LIKE '%refuse me%' THEN
          RAISE EXCEPTION 'this text is refused';
        END IF;
        RETURN NEW;
      END $f$)sql");
    tx.exec(
        "CREATE TRIGGER refuse_then_cut BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION "
        "refuse_then_cut()");
  }
  baton::worker::Completer completer({.url = database_url(), .schema = schema_}, nullptr);
  completer.start();
  completer.add(retry_in_a_minute(id, "refuse me"));
  ASSERT_TRUE(completer.wait_flushed(20s));
  completer.stop(1s);
  EXPECT_GE(count("SELECT last_value FROM safe_writes"), 2)
      << "the safe form was not written a second time, so no connection was lost writing it";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE id = " + std::to_string(id) +
                  " AND state = 'available' AND last_error LIKE 'the outcome could not be "
                  "recorded as it was%refuse me'"),
            1)
      << "the failure was dropped: the job is still running";
}

TEST_F(Worker, OutcomesWhoseCommitLostItsAnswerAreWrittenOnceAndNeverCountedAsFenced) {
  // The connection is lost after the server ran a write's COMMIT and before its answer arrived:
  // the completer cannot tell whether the outcomes were written. Sent again after they were, each
  // would find its job gone and be counted as fenced (an alert for a deposed leader); not sent
  // again after they were not, the jobs would stay running until a rescue and run twice. The
  // server knows: the completer asks it before writing again.
  const auto ids = running_jobs(6, "t", 1);
  // The second round's first COMMIT fails on the server as it commits (its session ends in a
  // deferred check): that write did not commit, and must be sent again.
  pqxx::nontransaction(*db_).exec("CREATE SEQUENCE commits_to_fail");
  at_commit_after_insert("job_history", "fail_first_commit",
                         "IF NEW.id > " + std::to_string(ids[2]) +
                             " AND nextval('commits_to_fail') = 1 THEN "
                             "PERFORM pg_terminate_backend(pg_backend_pid()); "
                             "PERFORM pg_sleep(5); END IF;");
  Proxy proxy(database_url());
  FenceCounter observer;
  baton::worker::Completer completer({.url = proxy.url_through(database_url()), .schema = schema_},
                                     &observer);
  completer.start();
  // Round 1: the answer to the COMMIT is lost after the server committed.
  proxy.lose_answer_to("COMMIT");
  add_three_outcomes(completer, ids, 0);
  ASSERT_TRUE(completer.wait_flushed(30s));
  EXPECT_EQ(proxy.answers_lost(), 1) << "no COMMIT lost its answer: the test tested nothing";
  // Round 2: the COMMIT fails on the server and the connection is lost with it.
  add_three_outcomes(completer, ids, 3);
  ASSERT_TRUE(completer.wait_flushed(30s));
  completer.stop(1s);
  EXPECT_GE(count("SELECT last_value FROM commits_to_fail"), 2)
      << "the second round's write was not sent again after its COMMIT failed on the server";

  EXPECT_EQ(observer.fenced.load(), 0u) << "outcomes written once were counted as fenced";
  expect_three_written_once(ids, 0, "round 1");
  expect_three_written_once(ids, 3, "round 2");
}

TEST_F(Worker, TheServerSaysWhatBecameOfATransactionAsItsCommitRanOrNeverRan) {
  // What a node asks after a COMMIT lost its answer, asked of transactions in each state.
  const auto ids = running_jobs(2, "t", 0);
  auto a_conn = connect(schema_), b_conn = connect(schema_);
  std::string a, b;
  pqxx::work a_tx(*a_conn), b_tx(*b_conn);
  ASSERT_TRUE(baton::detail::complete_in(
      a_tx, {.id = ids[0], .epoch = 1, .token = 0, .run_seconds = 0.001}, &a));
  ASSERT_TRUE(baton::detail::complete_in(
      b_tx, {.id = ids[1], .epoch = 1, .token = 0, .run_seconds = 0.001}, &b));
  // Both still open, `b` the newest transaction: neither has ended.
  EXPECT_EQ(baton::detail::transaction_status(*db_, a), "in progress");
  EXPECT_EQ(baton::detail::transaction_status(*db_, b), "in progress");
  a_tx.commit();
  b_tx.abort();
  EXPECT_EQ(baton::detail::transaction_status(*db_, a), "committed");
  EXPECT_EQ(baton::detail::transaction_status(*db_, b), "aborted");
  // The same number from another server (one promoted since, or the same one restarted), or a
  // number this server never handed out: it cannot tell.
  const auto at = a.find('@');
  ASSERT_NE(at, std::string::npos) << a;
  EXPECT_EQ(baton::detail::transaction_status(*db_, a.substr(0, at) + "@1"), "unknown");
  EXPECT_EQ(baton::detail::transaction_status(*db_, "999999999999" + a.substr(at)), "unknown");
}

TEST_F(Worker, ATransactionalJobWhoseCommitLostItsAnswerIsDoneAndNotRetried) {
  // A transactional handler's writes and its completion commit together; the answer to that
  // COMMIT is lost. The server committed: the job is done, and must be neither retried nor its
  // failure counted as fenced.
  auto run = ledger_run();
  run->proxy.lose_answer_to("COMMIT");
  run_ledger_job(*run);
  if (HasFatalFailure()) return;
  EXPECT_EQ(run->proxy.answers_lost(), 1) << "no COMMIT lost its answer: the test tested nothing";
  expect_ledger_done_once(*run);
  EXPECT_EQ(run->observer.database_errors.load(), 1) << "the lost connection was not counted";
}

TEST_F(Worker, OutcomesWhoseCommitStillRanWhenTheConnectionWasLostAreWaitedForAndWrittenOnce) {
  // The connection is lost while the server is still committing a write (a deferred check runs
  // for 2 s): asked at once, the server says "in progress". Sent again then, the outcomes would
  // wait for that transaction's row locks and, once it commits, find their jobs gone and be
  // counted as fenced. The completer waits until the server can say how it ended.
  const auto ids = running_jobs(3, "t", 1);
  // Not ended by the server's check of the client (a node's sessions look every second): a
  // commit that waits for a synchronous standby runs on the same way.
  pqxx::nontransaction(*db_).exec("CREATE SEQUENCE slow_commits");
  at_commit_after_insert("job_history", "slow_first_commit",
                         "IF nextval('slow_commits') = 1 THEN "
                         "PERFORM set_config('client_connection_check_interval', '0', true); "
                         "PERFORM pg_sleep(2); END IF;");
  Proxy proxy(database_url());
  FenceCounter observer;
  baton::worker::Completer completer({.url = proxy.url_through(database_url()), .schema = schema_},
                                     &observer);
  completer.start();
  proxy.cut_after("COMMIT");
  add_three_outcomes(completer, ids, 0);
  ASSERT_TRUE(completer.wait_flushed(30s));
  completer.stop(1s);
  EXPECT_EQ(proxy.answers_lost(), 1) << "no COMMIT was cut: the test tested nothing";
  EXPECT_GE(observer.database_errors.load(), 2)
      << "the completer never heard \"in progress\": the write had ended when it asked";
  EXPECT_EQ(observer.fenced.load(), 0u) << "outcomes written once were counted as fenced";
  expect_three_written_once(ids, 0, "the write that was waited for");
}

TEST_F(Worker, ATransactionalJobWhoseCommitStillRanWhenTheConnectionWasLostIsDoneAndNotRetried) {
  // As ATransactionalJobWhoseCommitLostItsAnswerIsDoneAndNotRetried, but the COMMIT runs for 2 s
  // on the server (a deferred check) after the connection is lost. The pool thread waits for the
  // server's answer, and the job is done, not failed and fenced.
  auto run = ledger_run();
  at_commit_after_insert("ledger", "slow_commit",
                         "PERFORM set_config('client_connection_check_interval', '0', true); "
                         "PERFORM pg_sleep(2);");
  run->proxy.cut_after("COMMIT");
  run_ledger_job(*run);
  if (HasFatalFailure()) return;
  EXPECT_EQ(run->proxy.answers_lost(), 1) << "no COMMIT was cut: the test tested nothing";
  expect_ledger_done_once(*run);
}

TEST_F(Worker, TheEndOfItsEpochCutsTheWaitForACommitThatLostItsConnection) {
  // A transactional job's COMMIT is held on the server (a deferred check waits for a lock this
  // test holds) when the connection is lost, and the pool thread waits for the server to say how
  // it ended. Leadership ends meanwhile: whatever the answer, the outcome would be fenced, so the
  // thread stops waiting at once instead of after kCommitDoubtWait (10 s).
  auto run = ledger_run();
  const std::string key = "hashtext('" + schema_ + "')";
  at_commit_after_insert("ledger", "held_commit",
                         "PERFORM set_config('client_connection_check_interval', '0', true); "
                         "PERFORM pg_advisory_xact_lock(" +
                             key + ");");
  // Declared after the run: released before its completer stops, on every path out of the test.
  auto holder = connect(schema_);
  pqxx::nontransaction(*holder).exec("SELECT pg_advisory_lock(" + key + ")");
  run->proxy.cut_after("COMMIT");
  submit_rows(*run->executor, "ledger");
  ASSERT_TRUE(wait_for([&] { return run->observer.database_errors.load() == 1; }, 20s))
      << "the job's COMMIT never lost its connection";
  EXPECT_FALSE(run->executor->wait_idle(500ms))
      << "the pool thread did not wait while the server still ran the COMMIT";
  run->executor->end_epoch(1);
  EXPECT_TRUE(run->executor->wait_idle(5s)) << "the end of the epoch did not cut the wait";
  run->executor.reset();
  holder.reset();
  ASSERT_TRUE(run->completer.wait_flushed(20s));
  EXPECT_EQ(run->proxy.answers_lost(), 1);
  // The held COMMIT went through once the lock was freed: the job ran once and is done.
  EXPECT_EQ(count("SELECT count(*) FROM ledger"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE outcome = 'completed'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
}

TEST_F(Worker, ABacklogOfOutcomesIsWrittenOldestFirstInWritesOfBoundedSize) {
  // Outcomes pile up while the database does not take them: here a lock on the history, in
  // production a server too busy to keep up. Once it takes them again they are written oldest
  // first, completions, retries and releases in the order they came, at most kMaxWrite to a
  // transaction: one write of everything could outlast its deadline, and be cut and sent again
  // larger each time.
  constexpr int kJobs = 12'000;
  static_assert(kJobs > 2 * baton::worker::Completer::kMaxWrite);
  const std::string log = "\"" + schema_ + "\".written";
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO jobs (queue, type, state, attempts, claimed_epoch, claimed_by, claimed_at, "
        "first_started_at, claims) SELECT 'default', 'noop', 'running', 1, 1, 'solo', now(), "
        "now(), 1 FROM generate_series(1, " +
        std::to_string(kJobs) + ")");
    // Which transaction wrote each outcome: a completion moves its job to the history, a retry or
    // a release makes it available again.
    tx.exec("CREATE TABLE " + log + " (xid bigint, id bigint)");
    tx.exec(
        "CREATE FUNCTION note_written() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO " +
        log + " VALUES (txid_current(), NEW.id); RETURN NULL; END $$");
    tx.exec(
        "CREATE TRIGGER note_written AFTER INSERT ON job_history FOR EACH ROW EXECUTE FUNCTION "
        "note_written()");
    tx.exec(
        "CREATE TRIGGER note_written AFTER UPDATE ON jobs FOR EACH ROW WHEN (NEW.state = "
        "'available' AND OLD.state = 'running') EXECUTE FUNCTION note_written()");
  }
  std::vector<std::int64_t> ids;
  {
    pqxx::nontransaction tx(*db_);
    for (const auto& row : tx.exec("SELECT id FROM jobs ORDER BY id"))
      ids.push_back(row[0].as<std::int64_t>());
  }
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(kJobs));
  auto blocker = connect(schema_);
  pqxx::work hold(*blocker);
  hold.exec("LOCK TABLE job_history IN SHARE MODE");

  baton::worker::Completer completer({.url = database_url(), .schema = schema_}, nullptr);
  completer.start();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i % 10 == 3) {
      completer.add(retry_in_a_minute(ids[i], "try again"));
    } else if (i % 10 == 7) {
      completer.add(baton::detail::Release{.id = ids[i], .epoch = 1, .token = 1});
    } else {
      completer.add(
          baton::detail::Completion{.id = ids[i], .epoch = 1, .token = 1, .run_seconds = 0.001});
    }
  }
  // The first write waits for the lock; everything else piles up behind it.
  ASSERT_TRUE(wait_count("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '\"" +
                             schema_ + "\".job_history'::regclass",
                         1));
  EXPECT_EQ(completer.pending(), static_cast<std::size_t>(kJobs));
  hold.commit();
  ASSERT_TRUE(completer.wait_flushed(60s));
  completer.stop(1s);

  EXPECT_EQ(count("SELECT count(*) FROM job_history"), kJobs - 2 * (kJobs / 10));
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available'"), 2 * (kJobs / 10));
  // Each write is a run of consecutive outcomes, following the one before.
  pqxx::nontransaction tx(*db_);
  const auto writes =
      tx.exec("SELECT count(*), min(id), max(id) FROM " + log + " GROUP BY xid ORDER BY xid");
  ASSERT_GE(writes.size(), 3u);
  std::size_t next = 0;  // index in ids of the next outcome expected
  for (const auto& w : writes) {
    const auto n = w[0].as<std::size_t>();
    EXPECT_LE(n, baton::worker::Completer::kMaxWrite);
    ASSERT_LT(next, ids.size());
    EXPECT_EQ(w[1].as<std::int64_t>(), ids[next]) << "a write did not start where the last ended";
    ASSERT_LE(next + n, ids.size());
    EXPECT_EQ(w[2].as<std::int64_t>(), ids[next + n - 1]) << "a write skipped an older outcome";
    next += n;
  }
  EXPECT_EQ(next, ids.size());
}

TEST_F(Worker, AQueueNeverRunsMoreThanItsConcurrencyLimit) {
  std::atomic<int> slow{0}, fast{0}, most_slow{0}, most_fast{0};
  auto config = test_config(schema_, "solo");
  config.threads = 4;
  config.queue_concurrency = {{"slow", 1}};
  RunningNode n(config, [&](Node& node) {
    node.handle("nap", [&](JobContext& ctx) {
      const bool is_slow = ctx.job().queue == "slow";
      auto& here = is_slow ? slow : fast;
      auto& most = is_slow ? most_slow : most_fast;
      const int now = ++here;
      for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
      }
      std::this_thread::sleep_for(100ms);
      --here;
    });
  });
  Client client(database_url(), schema_);
  client.enqueue_copies("nap", {}, 6, EnqueueOptions{.queue = "slow"});
  client.enqueue_copies("nap", {}, 12, EnqueueOptions{.queue = "fast"});
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 18; }, 30s));
  EXPECT_EQ(most_slow.load(), 1);
  EXPECT_GE(most_fast.load(), 3) << "the other queues use the rest of the pool";
}

TEST_F(Worker, HowManyJobsRunAtOnceFollowsWhetherTheyNeedTheCpuOrWait) {
  // 16 threads. Jobs that wait (a sleep, as I/O would) run 16 at a time; jobs that keep their
  // thread's CPU busy run about one per core: more would only take turns on the cores.
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  if (cores >= 8) GTEST_SKIP() << "with " << cores << " cores a CPU-bound pool of 16 may be right";
  std::atomic<int> now{0}, most{0};
  std::atomic<int> done{0};
  std::atomic<int> most_late{0};  // among the later half of the CPU-bound jobs
  auto note = [&](std::atomic<int>& peak) {
    const int n = ++now;
    for (int seen = peak.load(); n > seen && !peak.compare_exchange_weak(seen, n);) {
    }
  };
  auto config = test_config(schema_, "solo");
  config.threads = 16;
  RunningNode n(config, [&](Node& node) {
    node.handle("wait", [&](JobContext&) {
      note(most);
      std::this_thread::sleep_for(50ms);
      --now;
    });
    node.handle("spin", [&](JobContext&) {
      const bool late = done.load() >= 40;
      if (late)
        note(most_late);
      else
        ++now;
      spin_cpu(5ms);
      --now;
      ++done;
    });
  });
  Client client(database_url(), schema_);
  client.enqueue_copies("wait", {}, 64);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 64; }, 30s));
  EXPECT_GE(most.load(), 12) << "jobs that wait should run on (nearly) every thread";
  client.enqueue_copies("spin", {}, 120);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 184; }, 60s));
  EXPECT_GE(most_late.load(), 1);
  EXPECT_LE(most_late.load(), 2 * cores)
      << "CPU-bound jobs ran " << most_late.load() << " at once on " << cores << " cores";
}

TEST_F(Worker, JobsThatWaitForEachOtherRunTogetherUpToTheThreadCount) {
  // CPU-bound jobs first, so that the pool runs one per core; then cores + 1 jobs that can only
  // finish together. With no job starting for a second, the executor lets every thread take one.
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  const int meeting = cores + 1;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0, most = 0;  // running now, and the most ever at once
  auto config = test_config(schema_, "solo");
  config.threads = meeting + 1;
  RunningNode n(config, [&](Node& node) {
    node.handle("spin", [](JobContext&) { spin_cpu(2ms); });
    node.handle("meet", [&](JobContext&) {
      std::unique_lock lock(m);
      most = std::max(most, ++arrived);
      cv.notify_all();
      cv.wait_for(lock, 20s, [&] { return most >= meeting; });
      --arrived;
    });
  });
  Client client(database_url(), schema_);
  client.enqueue_copies("spin", {}, 16);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 16; }, 30s));
  client.enqueue_copies("meet", {}, meeting);
  ASSERT_TRUE(
      wait_for([&] { return count("SELECT count(*) FROM job_history") == 16 + meeting; }, 60s));
  std::lock_guard lock(m);
  EXPECT_EQ(most, meeting) << "the jobs that wait for each other never all ran at once";
}

TEST_F(Worker, AfterAStallCpuBoundJobsGoBackToAboutOnePerCore) {
  // The stall rule lets every thread take a job while none has started for a second. Once jobs
  // start again it must end: a backlog of CPU-bound jobs queued behind the stall would otherwise
  // run on every thread until the executor's queue is empty, taking turns on the cores. Here
  // the whole backlog is in the executor's queue from the start: CPU-bound jobs, then jobs that
  // can only finish together (the stall), then more CPU-bound jobs.
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  if (cores >= 8) GTEST_SKIP() << "with " << cores << " cores a CPU-bound pool of 16 may be right";
  const int meeting = cores + 1;
  const int before = 100, after = 1500;
  {
    pqxx::nontransaction tx(*db_);
    const auto rows = [&](const std::string& type, int n) {
      tx.exec(
          "INSERT INTO jobs (queue, type, state, attempts, claimed_epoch, claimed_by, "
          "claimed_at, first_started_at) SELECT 'default', '" +
          type + "', 'running', 1, 1, 'solo', now(), now() FROM generate_series(1, " +
          std::to_string(n) + ")");
    };
    rows("spin", before);
    rows("meet", meeting);
    rows("spin", after);
  }
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0, most_met = 0;
  // When the meeting ended (steady-clock nanoseconds, 0: not yet). The CPU-bound jobs read it
  // without a lock: a handler that waits for a lock looks to the executor like one that waits.
  std::atomic<std::int64_t> met_ns{0};
  const auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::atomic<int> now{0}, most_late{0}, late{0};
  baton::detail::HandlerRegistry handlers;
  handlers.add("meet", baton::Handler([&](JobContext&) {
                 std::unique_lock lock(m);
                 most_met = std::max(most_met, ++arrived);
                 cv.notify_all();
                 cv.wait_for(lock, 20s, [&] { return most_met >= meeting; });
                 if (met_ns.load() == 0) met_ns.store(now_ns());
               }));
  handlers.add("spin", baton::Handler([&](JobContext&) {
                 const auto met = met_ns.load();
                 const bool is_late =
                     met != 0 && now_ns() - met > std::chrono::nanoseconds(1500ms).count();
                 const int n = ++now;
                 if (is_late) {
                   ++late;
                   for (int seen = most_late.load();
                        n > seen && !most_late.compare_exchange_weak(seen, n);) {
                   }
                 }
                 spin_cpu(5ms);
                 --now;
               }));
  run_rows(handlers, 16, 1, "", 120s);
  if (HasFatalFailure()) return;
  {
    std::lock_guard lock(m);
    EXPECT_EQ(most_met, meeting) << "the jobs that wait for each other never all ran at once";
  }
  ASSERT_GT(late.load(), 0) << "no CPU-bound job started 1.5 s after the stall ended";
  EXPECT_LE(most_late.load(), 2 * cores) << "1.5 s after the stall ended, CPU-bound jobs still ran "
                                         << most_late.load() << " at once on " << cores << " cores";
}

TEST_F(Worker, RevokeCancelsRunningHandlers) {
  std::atomic<int> saw_cancel{0}, started{0};
  auto config = test_config(schema_, "solo");
  config.threads = 2;
  RunningNode n(config, [&](Node& node) {
    node.handle("wait_for_cancel", [&](JobContext& ctx) {
      ++started;
      const auto until = std::chrono::steady_clock::now() + 20s;
      while (!ctx.cancelled() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(5ms);
      }
      if (ctx.cancelled()) ++saw_cancel;
      throw std::runtime_error("cancelled");
    });
  });
  Client(database_url(), schema_).enqueue_copies("wait_for_cancel", {}, 6);
  // Two handlers running (not only two jobs claimed: a claimed job that has not started when
  // the revoke comes is released, not cancelled).
  ASSERT_TRUE(wait_for([&] { return started.load() == 2; }, 20s));
  // Cut the election session: the node loses leadership (and, alone, wins it back later).
  count("SELECT count(*) FILTER (WHERE pg_terminate_backend(holder_pid)) FROM locks");
  ASSERT_TRUE(wait_for([&] { return saw_cancel.load() >= 2; }, 10s))
      << "running handlers were not cancelled on revoke";
}

TEST_F(Worker, AClaimThatCommittedUnansweredRunsOnceTheClaimSessionIsBack) {
  // A claim session cut as its claim commits (the call watch at the lease's end, a proxy, a
  // restart of the network) leaves the claimed jobs running under the leader's own epoch, in no
  // run of it: the rescue takes only older epochs'. Here the rows such a claim leaves are
  // written by hand, then the node's sessions are cut, all but the election's (so the epoch
  // stays). The poller must run them, once each, under the same epoch; not a job claimed by
  // another node name, nor the jobs of its own earlier claims.
  RunsById runs;
  std::atomic<bool> release{false};
  auto config = test_config(schema_, "solo");
  RunningNode n(config, [&](Node& node) {
    node.handle("once", [&](JobContext& ctx) { runs.ran(ctx); });
    node.handle("held", [&](JobContext& ctx) {
      runs.ran(ctx);
      const auto until = std::chrono::steady_clock::now() + 20s;
      while (!release.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
    });
  });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  const auto epoch = count("SELECT epoch FROM locks");
  // An answered claim first: its time is the one later claims are told from.
  // Two of them still running when the sessions are cut.
  Client(database_url(), schema_).enqueue_copies("once", {}, 5);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 5; }, 20s));
  Client(database_url(), schema_).enqueue_copies("held", {}, 2);
  ASSERT_TRUE(wait_for([&] { return runs.jobs() == 7; }, 20s));
  const auto claim_as = [&](const std::string& node, int copies) {
    count(
        "WITH i AS (INSERT INTO jobs (queue, type, state, attempts, claims, claimed_at, "
        "first_started_at, claimed_by, claimed_epoch, claim_group) "
        "SELECT 'default', 'once', 'running', 1, 1, clock_timestamp(), clock_timestamp(), '" +
        node + "', l.epoch, l.region || '/' || l.lock_key FROM locks l, generate_series(1, " +
        std::to_string(copies) + ") RETURNING 1) SELECT count(*) FROM i");
  };
  claim_as("solo", 20);
  claim_as("stranger", 1);
  const auto cut = count(
      "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
      "WHERE application_name = '" +
      baton::detail::node_application_name("solo", schema_) +
      "' AND pid <> (SELECT holder_pid FROM locks)");
  ASSERT_GE(cut, 1);
  // The held jobs stay in their runs until a job of the unanswered claim has started (they hold
  // the places of CPU-bound work, so the rest start after them).
  ASSERT_TRUE(wait_for([&] { return runs.jobs() > 7; }, 20s))
      << count("SELECT count(*) FROM jobs WHERE state = 'running' AND claimed_by = 'solo'")
      << " jobs of the unanswered claim are still running under epoch " << epoch;
  release.store(true);
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 27; }, 20s))
      << count("SELECT count(*) FROM jobs WHERE state = 'running' AND claimed_by = 'solo'")
      << " jobs of the unanswered claim are still running under epoch " << epoch;
  EXPECT_EQ(count("SELECT epoch FROM locks"), epoch) << "the leader changed: a rescue ran them";
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE attempts <> 1 OR epoch <> " +
                  std::to_string(epoch)),
            0);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE claimed_by = 'stranger' AND state = 'running'"),
            1)
      << "a job claimed under this epoch by another node name was taken";
  runs.expect_each_once(27);
}

TEST_F(Worker, AnUnansweredClaimIsTakenOnceItsSessionEndedItsTransactionAndOnlyOnce) {
  // The pieces the poller settles a cut claim session with: a session still in its claim's
  // transaction is seen as busy (its rows are not visible yet: taking them then would miss
  // them); once it committed, the jobs it claimed between the last answered claim and the
  // reconnection are taken, stamped claimed anew, once; not an older claim's.
  namespace detail = baton::detail;
  const detail::Claimer me{{"k", "r"}, "me", 7};
  Client(database_url(), schema_).enqueue_copies("noop", {}, 4);
  const auto older = count("SELECT min(id) FROM jobs");
  const std::string claim =
      "UPDATE jobs SET state = 'running', attempts = attempts + 1, claims = claims + 1, "
      "claimed_at = now(), claimed_by = 'me', claimed_epoch = 7, claim_group = '" +
      me.lock.group() + "' WHERE id ";
  count("WITH c AS (" + claim + "= " + std::to_string(older) +
        " RETURNING 1) SELECT count(*) FROM c");
  auto cut = detail::connect({.url = database_url(), .schema = schema_});
  auto mine = detail::connect({.url = database_url(), .schema = schema_});
  const auto cut_session = detail::server_session(*cut);
  ASSERT_GT(cut_session.pid, 0);
  const auto after = detail::server_session(*mine).now_us;
  pqxx::work in_flight(*cut);
  in_flight.exec(claim + "<> " + std::to_string(older));
  const auto before = detail::server_session(*mine).now_us;
  EXPECT_TRUE(detail::cut_session_busy(*mine, cut_session));
  EXPECT_TRUE(detail::unanswered_claim(*mine, me, after, before, schema_).empty());
  in_flight.commit();
  EXPECT_FALSE(detail::cut_session_busy(*mine, cut_session));
  const auto taken = detail::unanswered_claim(*mine, me, after, before, schema_);
  ASSERT_EQ(taken.size(), 3u);
  for (const auto& j : taken) {
    EXPECT_NE(j.job.id, older);
    EXPECT_EQ(j.job.epoch, 7);
    EXPECT_EQ(j.token, 1);
    EXPECT_EQ(j.job.attempt, 1);
    EXPECT_GT(j.claimed_at_us, before);
  }
  EXPECT_TRUE(detail::unanswered_claim(*mine, me, after, before, schema_).empty())
      << "jobs of an unanswered claim were taken twice";
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'running'"), 4);
}

TEST_F(Worker, ClaimsThatCannotComeBackWithinTheLeaseTakeFewerJobsUntilTheyDo) {
  // A claim is cut when its time runs out: three of the leader's own leases, even while the lease
  // is renewed. When a claim of the jobs waiting always takes longer than that (large payloads, a
  // slow server or link; here a trigger makes claiming each row take 1.6 s), claiming the same
  // jobs again would cut again, and nothing would ever run. With a 2 s lease (1.88 s of its own)
  // a claim has 5.64 s: a claim of the 4 jobs (6.4 s) is cut, and the server sees its client gone
  // at its next check (every second) and rolls it back. Claims of 2 (3.2 s) come back.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.type = 'slow' AND OLD.state = 'available' AND NEW.state = 'running' THEN "
        "PERFORM pg_catalog.pg_sleep(1.6); END IF; RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION "
        "slow_claim()");
  }
  RunsById runs;
  auto config = test_config(schema_, "solo");
  config.lock_ttl = std::chrono::seconds(2);
  config.metrics_listen = "127.0.0.1:0";
  RunningNode n(config,
                [&](Node& node) { node.handle("slow", [&](JobContext& ctx) { runs.ran(ctx); }); });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  const auto epoch = count("SELECT epoch FROM locks");
  Client(database_url(), schema_).enqueue_copies("slow", {}, 4);
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 4, 60s))
      << count("SELECT count(*) FROM job_history") << " of 4 jobs finished; "
      << count("SELECT count(*) FROM jobs WHERE state = 'available'") << " never claimed";
  EXPECT_EQ(count("SELECT epoch FROM locks"), epoch) << "the leader changed";
  // The operator sees the cuts counted by their reason.
  const auto page = scrape(n.node().metrics_address());
  EXPECT_GE(metric_sum(page, "baton_claims_cut_total{reason=\"lease_end\"}"), 1) << page;
  runs.expect_each_once(4);
}

TEST_F(Worker, AClaimLongerThanALeaseComesBackWhileTheLeaseIsRenewed) {
  // A claim that takes longer than the lease it started in (a server whose cores are taken by
  // producers; here a trigger makes claiming the job take 2.5 s, against a lease of 1.88 s of the
  // leader's own) is not cut while the elector renews the lease: its answer is still of use. Cut
  // at the lease's end as it stood when the claim was sent, it would be cut again on every try,
  // and the job would never run.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.type = 'slow' AND OLD.state = 'available' AND NEW.state = 'running' THEN "
        "PERFORM pg_catalog.pg_sleep(2.5); END IF; RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION "
        "slow_claim()");
  }
  std::atomic<int> runs{0};
  auto config = test_config(schema_, "solo");
  config.lock_ttl = std::chrono::seconds(2);
  config.metrics_listen = "127.0.0.1:0";
  RunningNode n(config, [&](Node& node) { node.handle("slow", [&](JobContext&) { ++runs; }); });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  const auto epoch = count("SELECT epoch FROM locks");
  Client(database_url(), schema_).enqueue("slow", {});
  EXPECT_TRUE(wait_count("SELECT count(*) FROM job_history", 1, 20s))
      << "the job never ran: its claim was cut at the lease's end, again and again";
  EXPECT_EQ(count("SELECT epoch FROM locks"), epoch) << "the leader changed";
  EXPECT_EQ(runs.load(), 1);
  const auto page = scrape(n.node().metrics_address());
  EXPECT_EQ(metric_sum(page, "baton_claims_cut_total{reason=\"lease_end\"}"), 0) << page;
}

TEST_F(Worker, AClaimCancelledOnTheServerIsCountedByItsReasonAndItsJobsRunOnce) {
  // A claim that the server cancels (its statement timeout, or an operator's pg_cancel_backend;
  // here the second, on a claim that a trigger holds up) fails as any error would. The operator
  // sees it counted under reason="statement_timeout", not as a lease's end nor uncounted, and the
  // jobs it would have claimed run once each.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("CREATE SEQUENCE held_claims");
    tx.exec(
        "CREATE FUNCTION held_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.type = 'slow' AND OLD.state = 'available' AND NEW.state = 'running' "
        "AND nextval('held_claims') = 1 THEN PERFORM pg_catalog.pg_sleep(60); END IF; "
        "RETURN NEW; END $$");
    tx.exec(
        "CREATE TRIGGER held_claim BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION "
        "held_claim()");
  }
  RunsById runs;
  auto config = test_config(schema_, "solo");
  config.metrics_listen = "127.0.0.1:0";
  RunningNode n(config,
                [&](Node& node) { node.handle("slow", [&](JobContext& ctx) { runs.ran(ctx); }); });
  ASSERT_TRUE(wait_count(kLeading, 1, 20s));
  const auto epoch = count("SELECT epoch FROM locks");
  Client(database_url(), schema_).enqueue_copies("slow", {}, 4);
  const std::string held =
      "SELECT coalesce(min(pid), 0) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND "
      "application_name = '" +
      baton::detail::node_application_name("solo", schema_) + "'";
  ASSERT_TRUE(wait_for([&] { return count(held) != 0; }, 20s)) << "no claim was held up";
  EXPECT_EQ(count("SELECT pg_catalog.pg_cancel_backend((" + held + "))::int"), 1);
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 4, 30s))
      << count("SELECT count(*) FROM job_history") << " of 4 jobs finished";
  EXPECT_EQ(count("SELECT epoch FROM locks"), epoch) << "the leader changed";
  const auto page = scrape(n.node().metrics_address());
  EXPECT_EQ(metric_sum(page, "baton_claims_cut_total{reason=\"statement_timeout\"}"), 1) << page;
  EXPECT_EQ(metric_sum(page, "baton_claims_cut_total{reason=\"lease_end\"}"), 0) << page;
  runs.expect_each_once(4);
}

TEST_F(Worker, AClaimThatWaitsOutAHeldRowIsCountedAndTheOtherJobsRun) {
  // An operator's SELECT ... FOR UPDATE holds one queued job: the claim waits the lock timeout
  // for it and gives up (counted, for the operator to see), later claims skip held rows, and
  // the held job runs once the operator's transaction ends.
  Client(database_url(), schema_).enqueue_copies("noop", {}, 3);
  auto operator_conn = baton::detail::connect({.url = database_url(), .schema = schema_});
  pqxx::work held(*operator_conn);
  const auto held_id =
      held.exec("SELECT id FROM jobs WHERE id = (SELECT min(id) FROM jobs) FOR UPDATE")[0][0]
          .as<std::int64_t>();
  std::mutex m;
  std::vector<std::int64_t> ran;
  auto config = test_config(schema_, "solo");
  config.metrics_listen = "127.0.0.1:0";
  RunningNode n(config, [&](Node& node) {
    node.handle("noop", [&](JobContext& ctx) {
      std::lock_guard lock(m);
      ran.push_back(ctx.job().id);
    });
  });
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 2, 20s));
  ASSERT_TRUE(wait_for(
      [&] {
        return metric_sum(scrape(n.node().metrics_address()),
                          "baton_claims_cut_total{reason=\"row_locked\"}") >= 1;
      },
      10s))
      << scrape(n.node().metrics_address());
  {
    std::lock_guard lock(m);
    EXPECT_EQ(std::count(ran.begin(), ran.end(), held_id), 0) << "the held job ran";
  }
  held.abort();
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 3, 90s))
      << "the held job did not run once its row was let go";
  std::lock_guard lock(m);
  EXPECT_EQ(ran.size(), 3u);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), held_id), 1);
}

TEST_F(Worker, AHungJobIsRescuedAfterItsTimeoutAndDiesWhenOutOfAttempts) {
  auto config = test_config(schema_, "solo");
  RunningNode n(config, [](Node&) {});
  // Jobs of this lock group claimed long ago (under an epoch no rescue of older epochs touches)
  // with a 1 ms timeout: their handler never answered.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO jobs (queue, type, state, attempts, max_attempts, timeout_ms, "
        "claimed_at, claimed_epoch, claimed_by, claim_group) VALUES "
        "('q', 'hung', 'running', 1, 3, 1, now() - interval '1 hour', 999999, 'x', "
        " 'default/baton-leader'), "
        "('q', 'hung', 'running', 3, 3, 1, now() - interval '1 hour', 999999, 'x', "
        " 'default/baton-leader')");
  }
  // One had no attempt left: dead with reason timeout. The other is retried, carrying the
  // timeout in its error history; with no handler on this node it waits for one.
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM dead_jobs") == 1; }, 20s));
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE reason = 'timeout'"), 1);
  ASSERT_TRUE(wait_for(
      [&] {
        return count(
                   "SELECT count(*) FROM jobs WHERE state = 'available' AND errors::text "
                   "LIKE '%timeout: no outcome%'") == 1;
      },
      20s));
}

// A call the call watch cuts at its deadline stops on the server too, not only in this process:
// a statement that would run for a minute leaves pg_stat_activity within seconds of the cut.
// (A cut claim that went on scanning a large backlog kept its server session busy; claims cut
// one after another piled up until the leader missed its renewal.)
TEST_F(Worker, ACallCutAtItsDeadlineEndsOnTheServer) {
  auto conn = baton::detail::connect({.url = database_url(), .schema = schema_});
  const auto pid = baton::detail::server_session(*conn).pid;
  ASSERT_GT(pid, 0);
  int owner = 0;
  const auto started = std::chrono::steady_clock::now();
  {
    auto armed = baton::detail::CallWatch::instance().arm(*conn, std::chrono::milliseconds(300),
                                                          baton::detail::owner_of(&owner));
    pqxx::nontransaction tx(*conn);
    EXPECT_THROW(tx.exec("SELECT pg_catalog.pg_sleep(60)"), std::exception);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 30s) << "the call was not cut";
  EXPECT_TRUE(wait_for(
      [&] {
        return count("SELECT count(*) FROM pg_stat_activity WHERE pid = " + std::to_string(pid)) ==
               0;
      },
      15s))
      << "the cut session (pid " << pid << ") still runs its statement on the server";
}

// libpq reports a call the watch cut as a lost connection ("Could not obtain client encoding:
// not connected."): the node's log says instead that the call was cut, and why. Any other
// failure keeps its own text, and so does one after a new connection whose last call was cut.
TEST_F(Worker, CutCallsAndEndedSessionsAreLoggedAsSuchAndOtherFailuresAsThemselves) {
  namespace detail = baton::detail;
  auto& watch = detail::CallWatch::instance();
  auto failure = [&](pqxx::connection& conn, const std::string& sql,
                     std::chrono::milliseconds budget, detail::CallWatch::Owner owner) {
    auto armed = watch.arm(conn, budget, owner);
    try {
      pqxx::nontransaction(conn).exec(sql);
    } catch (const std::exception& e) {
      return detail::failure_text(e);
    }
    return std::string("no failure");
  };
  int owner = 0;
  {
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    const auto text =
        failure(*conn, "SELECT pg_catalog.pg_sleep(60)", 300ms, detail::owner_of(&owner));
    EXPECT_NE(text.find("cut at its deadline"), std::string::npos) << text;
  }
  {
    // As the node's loops see it: the guard is gone by the time the failure is logged.
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    std::string text;
    try {
      auto armed = watch.arm(*conn, 300ms, detail::owner_of(&owner));
      pqxx::nontransaction(*conn).exec("SELECT pg_catalog.pg_sleep(60)");
    } catch (const std::exception& e) {
      text = detail::failure_text(e);
    }
    EXPECT_NE(text.find("cut at its deadline"), std::string::npos) << text;
  }
  {
    // Cut by an abort (leadership ended, shutdown) while the statement runs on the server.
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    const auto pid = detail::server_session(*conn).pid;
    std::thread aborter([&] {
      wait_for(
          [&] {
            return count(
                       "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                       "AND pid = " +
                       std::to_string(pid)) == 1;
          },
          10s);
      watch.abort(detail::owner_of(&owner));
    });
    const auto text =
        failure(*conn, "SELECT pg_catalog.pg_sleep(60)", 60s, detail::owner_of(&owner));
    aborter.join();
    watch.end_abort(detail::owner_of(&owner));
    EXPECT_NE(text.find("cut as the node stopped or its leadership ended"), std::string::npos)
        << text;
  }
  {
    // Not cut: the server's own error.
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    const auto text = failure(*conn, "SELECT 1 / 0", 60s, detail::owner_of(&owner));
    EXPECT_NE(text.find("division by zero"), std::string::npos) << text;
    // A cut not logged (a loop reports only its first failure), then a new connection that
    // fails: that failure is the connection's, not the cut call's.
    {
      auto armed = watch.arm(*conn, 300ms, detail::owner_of(&owner));
      EXPECT_THROW(pqxx::nontransaction(*conn).exec("SELECT pg_catalog.pg_sleep(60)"),
                   std::exception);
    }
    std::string refused;
    try {
      detail::connect({.url = "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=5",
                       .schema = schema_});
    } catch (const std::exception& e) {
      refused = detail::failure_text(e);
    }
    EXPECT_FALSE(refused.empty()) << "nothing listens on port 1, yet the connection was made";
    EXPECT_EQ(refused.find("cut"), std::string::npos) << refused;
  }
  {
    // The server ends the session (a terminated backend, a restart): the line says the
    // connection was lost, not libpqxx's "client encoding".
    auto conn = detail::connect({.url = database_url(), .schema = schema_});
    const auto pid = detail::server_session(*conn).pid;
    ASSERT_TRUE(end_session(pid));
    // The first call on the closed connection (a node drops the connection after it).
    const auto text = failure(*conn, "SELECT 1", 60s, detail::owner_of(&owner));
    EXPECT_EQ(text.find("client encoding"), std::string::npos) << text;
    EXPECT_NE(text.find("connection to the database was lost"), std::string::npos) << text;
  }
}

TEST_F(Worker, AConnectionWhoseSessionEndedNeverComesBackWithoutItsSettings) {
  // A node's connection runs in baton's schema with its own timeouts, set once per session.
  // libpqxx would open a new session by itself on the next call after the server ended one,
  // without those settings: in the default search_path (where a role that can create objects
  // there would be found first) and with no statement timeout. It must fail instead, so that
  // its owner connects again through detail::connect.
  namespace detail = baton::detail;
  auto conn =
      detail::connect({.url = database_url(), .schema = schema_, .statement_timeout_ms = 4321});
  const auto pid = detail::server_session(*conn).pid;
  ASSERT_TRUE(end_session(pid));
  for (int call = 1; call <= 3; ++call) {
    std::string settings;
    std::string failure;
    try {
      pqxx::nontransaction tx(*conn);
      auto r = tx.exec(
          "SELECT pg_catalog.current_setting('search_path') || ' ' || "
          "pg_catalog.current_setting('statement_timeout')");
      settings = r[0][0].c_str();
    } catch (const std::exception& e) {
      EXPECT_TRUE(detail::is_connection_error(e)) << e.what();
      failure = detail::failure_text(e);
    }
    EXPECT_EQ(settings, "") << "call " << call << " ran in a session of its own making";
    // What the node's loops test before reusing a connection that a failure may have ended.
    EXPECT_FALSE(conn->is_open()) << "call " << call;
    EXPECT_NE(failure.find("connection to the database was lost"), std::string::npos)
        << "call " << call << ": " << failure;
  }
  // A connection made again has them.
  conn = detail::connect({.url = database_url(), .schema = schema_, .statement_timeout_ms = 4321});
  {
    pqxx::nontransaction tx(*conn);
    EXPECT_EQ(std::string(
                  tx.exec("SELECT pg_catalog.current_setting('statement_timeout')")[0][0].c_str()),
              "4321ms");
  }
  // A COMMIT whose session ended (libpqxx calls its outcome in doubt) is a connection's failure
  // too: the node's loops make a new connection after it.
  const auto again = detail::server_session(*conn).pid;
  pqxx::work tx(*conn);
  tx.exec("SELECT 1");
  ASSERT_TRUE(end_session(again));
  bool failed = false;
  try {
    tx.commit();
  } catch (const std::exception& e) {
    failed = true;
    EXPECT_TRUE(detail::is_connection_error(e)) << e.what();
  }
  EXPECT_TRUE(failed) << "a COMMIT on an ended session succeeded";
  EXPECT_FALSE(conn->is_open());
}

TEST_F(Worker, AHandlerThatLostItsSessionAndThrewItsOwnErrorCostsTheNextJobNothing) {
  // A transactional handler whose session ended (here it ends its own backend) and which then
  // throws an error of its own: its pool thread's connection is closed, though the error does
  // not say so. The next job on that thread must get a new connection, not fail an attempt on
  // the closed one.
  std::mutex m;
  std::map<std::int64_t, std::thread::id> ran_on;
  auto config = test_config(schema_, "solo");
  config.threads = 1;
  RunningNode n(config, [&](Node& node) {
    node.handle_tx("tx", [&](JobContext& ctx, pqxx::work& tx) {
      {
        std::lock_guard lock(m);
        ran_on[ctx.job().id] = std::this_thread::get_id();
      }
      if (ctx.payload().value("break", false)) {
        try {
          tx.exec("SELECT pg_catalog.pg_terminate_backend(pg_catalog.pg_backend_pid())");
        } catch (const std::exception&) {
          // A handler that swallows the database's error...
        }
        throw std::runtime_error("the handler's own error");  // ...and reports its own.
      }
    });
  });
  Client client(database_url(), schema_);
  int same_thread = 0;
  for (int round = 1; round <= 6; ++round) {
    const auto broke = client.enqueue("tx", {{"break", true}}, {.max_attempts = 1});
    ASSERT_TRUE(
        wait_count("SELECT count(*) FROM dead_jobs WHERE id = " + std::to_string(broke), 1, 20s));
    const auto next = client.enqueue("tx", nlohmann::json::object(), {.max_attempts = 5});
    ASSERT_TRUE(
        wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(next), 1, 20s));
    EXPECT_EQ(count("SELECT attempts FROM job_history WHERE id = " + std::to_string(next)), 1)
        << "round " << round << ": the job after the closed connection failed an attempt";
    std::lock_guard lock(m);
    if (ran_on[broke] == ran_on[next]) ++same_thread;
  }
  EXPECT_GT(same_thread, 0) << "no job ran on the thread whose connection was closed, so the "
                               "test did not make its case";
}

TEST_F(Worker, ATransactionalJobAfterTheServerEndedItsThreadsIdleSessionRunsOnItsFirstAttempt) {
  // A pool thread's connection sits idle while the server ends its session (a restart, a
  // failover, here pg_terminate_backend). The next transactional job on that thread finds out
  // before its handler runs, and must not lose its attempt to it: with one attempt it would be
  // dead.
  std::atomic<long long> backend{0};
  auto config = test_config(schema_, "solo");
  config.threads = 1;
  RunningNode n(config, [&](Node& node) {
    node.handle_tx("tx", [&](JobContext&, pqxx::work& tx) {
      backend = tx.exec("SELECT pg_catalog.pg_backend_pid()")[0][0].as<long long>();
    });
  });
  Client client(database_url(), schema_);
  const auto first = client.enqueue("tx", nlohmann::json::object());
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(first), 1, 20s));
  const auto pid = backend.load();
  ASSERT_TRUE(end_session(pid));
  const auto next = client.enqueue("tx", nlohmann::json::object(), {.max_attempts = 1});
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history WHERE id = " + std::to_string(next) +
                             " UNION ALL SELECT count(*) FROM dead_jobs WHERE id = " +
                             std::to_string(next) + " ORDER BY 1 DESC LIMIT 1",
                         1, 20s));
  EXPECT_EQ(count("SELECT count(*) FROM job_history WHERE outcome = 'completed' AND attempts = 1 "
                  "AND id = " +
                  std::to_string(next)),
            1)
      << "the job lost its only attempt to the ended session";
  EXPECT_NE(backend.load(), pid) << "the job ran on the ended session";
}

TEST_F(Worker, AStoppedNodeReleasesItsLeadershipAndMarksItselfStopped) {
  // A node that stops gracefully releases the lock row (a follower need not wait for the lease
  // to run out, and the leadership history says why) and marks its nodes row stopped (batonctl
  // nodes and a shard-count change see it gone at once). Both statements run after stop() has
  // cut the election's calls in flight: they must not be cut with them.
  std::int64_t epoch = 0;
  {
    RunningNode n(test_config(schema_, "solo"), [](Node&) {});
    ASSERT_TRUE(wait_count(kLeading, 1, 20s));
    epoch = count("SELECT epoch FROM locks");
  }
  EXPECT_EQ(count("SELECT count(*) FROM leadership_events WHERE event = 'released' AND "
                  "reason = 'shutting_down' AND node_id = 'solo' AND epoch = " +
                  std::to_string(epoch)),
            1)
      << "the stopped leader did not release its lock row";
  EXPECT_EQ(count("SELECT count(*) FROM locks WHERE expires_at = renewed_at"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM nodes WHERE node_id = 'solo' AND role = 'stopped'"), 1)
      << "the stopped node's row does not say so";
}

TEST_F(Worker, ThePrunerDeletesOnlyHistoryOlderThanTheRetention) {
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO job_history (id, queue, type, payload, priority, attempts, created_at, "
        "run_at, finished_at, outcome) SELECT i, 'q', 't', '{}', 0, 1, now(), now(), "
        "now() - (CASE WHEN i <= 2500 THEN interval '2 hours' ELSE interval '10 minutes' END), "
        "'completed' FROM generate_series(1, 3000) i");
  }
  auto config = test_config(schema_, "solo");
  config.history_retention = std::chrono::hours(1);
  RunningNode n(config, [](Node&) {});
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 500; }, 20s))
      << count("SELECT count(*) FROM job_history") << " rows left";
  EXPECT_EQ(count("SELECT min(id) FROM job_history"), 2501);
}

}  // namespace
