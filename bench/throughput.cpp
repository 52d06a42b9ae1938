// bench/throughput: issue 10's figures on a local cluster. Prints a table and one JSON object per
// figure (`"bench"` is enqueue, drain, cpu, memory, backlog, sleep_jobs, latency,
// latency_floor, latency_claim or console).
//   enqueue     single sequential enqueues on one connection; batches of 1,000 and 10,000;
//               COPY of 1,000 rows a statement into the same table, the batches' floor
//   drain       N queued no-op jobs drained by 1 leader + 2 passive batond processes
//   cpu         the leader's CPU time (user + system) per 1,000 jobs of that drain
//   memory      the leader's peak resident set (VmHWM) during that drain
//   backlog     the drain rate with a large backlog, as a share of the median of the drains of
//               --drain jobs beside it: the --runs above and as many again after it
//   sleep_jobs  1 ms sleep jobs on 16 threads, as a share of the 16,000 jobs/s ideal
//   latency     on an idle node, enqueue return to handler start (both on this process's clock),
//               one job at a time, --gap (whole milliseconds) idle between a job's start and
//               the next enqueue
//   latency_floor  the same with the least a NOTIFY-based queue does (an INSERT that notifies;
//               a listener that claims one row FOR UPDATE SKIP LOCKED when notified), enqueue
//               return to the notification and to the claim's answer; not in the default set
//   latency_claim  the same listener claiming through baton's own claim from baton's jobs table
//               (the poller's session settings, a lock row of its own): baton's claim alone,
//               to set beside latency_floor in one run; not in the default set
//   console     the drain with --console-pages open console pages (served by a passive node,
//               each refreshing the queues and cluster pages every 2 s) vs none, interleaved
//
//   bench/throughput [--drain 100000] [--samples 1000] [--threads 16] [--batch-size 1000]
//                    [--backlog 0] [--sleep-jobs 48000] [--runs 3]
//                    [--console-pages 10]
//                    [--only enqueue,drain,sleep,latency,latency_floor,latency_claim,console]
//                    [--lock-ttl 500ms] [--gap 2ms]
// --threads 0 and --batch-size 0 leave the node's own defaults, and so does no --lock-ttl. The
// drain figures count the leader changes from the nodes' start to the drain's end (each one
// fences the outcomes of the leader it replaced; their jobs run again).
// Figures are medians of --runs runs, printed with their range; latency, latency_floor and
// latency_claim are one run of --samples each.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include <baton/baton.h>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/migrations.h"
#include "bench_db.h"
#include "support/testkit.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Options {
  long long drain = 100'000;
  int samples = 1000;
  int threads = 16;
  int batch_size = 1000;
  long long backlog = 0;
  long long sleep_jobs = 48'000;
  int runs = 3;  // each figure is the median of this many runs (the large backlog: one)
  int console_pages = 10;
  std::string only = "enqueue,drain,sleep,latency";
  std::string lock_ttl;  // empty: the node's default
  baton::Millis gap{2};  // latency: idle time between samples
  bool wants(const std::string& part) const {
    return ("," + only + ",").find("," + part + ",") != std::string::npos;
  }
};

void figure(const char* name, const nlohmann::json& values) {
  nlohmann::json j{{"bench", name}};
  j.update(values);
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// CPU seconds (user + system) a process has used so far.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start after the last ')'.
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A /proc/<pid>/status field in kB (VmHWM, VmRSS).
long long status_kb(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  }
  return -1;
}

class Bench {
 public:
  Bench(std::string url, Options o) : url_(std::move(url)), o_(o) {
    schema_ = "bench_tp_" + std::to_string(getpid());
    dir_ = baton::test::temp_dir("bench-throughput");
    db_ = baton::detail::connect({.url = url_, .schema = schema_, .application_name = "bench"});
    baton::detail::migrate(*db_, schema_);
  }
  ~Bench() {
    nodes_.clear();
    try {
      pqxx::nontransaction(*db_).exec("DROP SCHEMA " + schema_ + " CASCADE");
    } catch (const std::exception&) {
    }
  }

  long long count(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    return tx.exec(sql)[0][0].as<long long>();
  }
  void exec(const std::string& sql) { pqxx::nontransaction(*db_).exec(sql); }

  // Starts n batond processes and returns the pid of the one that leads. Node ids are new for
  // every start: with reused ids, a previous run's unexpired lease would name a new process.
  pid_t start_nodes(int n) {
    ++starts_;
    for (int i = 1; i <= n; ++i) {
      std::string id = "r";
      id += std::to_string(starts_);
      id += "n";
      id += std::to_string(i);
      std::vector<std::string> args{baton::test::binary("demo_node"),
                                    "--database-url",
                                    url_,
                                    "--schema",
                                    schema_,
                                    "--node-id",
                                    id,
                                    "--no-migrate",
                                    "--metrics-listen",
                                    "off",
                                    "--log-level",
                                    "warn"};
      // 0: the node's own default.
      if (o_.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o_.threads)});
      if (o_.batch_size > 0) {
        args.insert(args.end(), {"--batch-size", std::to_string(o_.batch_size)});
      }
      if (!o_.lock_ttl.empty()) args.insert(args.end(), {"--lock-ttl", o_.lock_ttl});
      if (i == n && !console_.empty()) args.insert(args.end(), {"--console-listen", console_});
      nodes_.push_back(
          std::make_unique<baton::test::Process>(std::move(args), dir_ + "/" + id + ".log"));
    }
    pid_t leader = -1;
    baton::test::wait_for(
        [&] {
          leader = leader_pid();
          return leader > 0;
        },
        30s);
    return leader;
  }

  // The pid of the batond process that leads now, or -1.
  pid_t leader_pid() {
    pqxx::nontransaction tx(*db_);
    auto r = tx.exec(
        "SELECT n.pid FROM locks l JOIN nodes n ON n.node_id = l.client_id "
        "WHERE l.expires_at > clock_timestamp()");
    if (r.empty()) return -1;
    // The nodes row may still show a previous run's process until the node refreshes it.
    const pid_t pid = r[0][0].as<int>();
    const bool ours =
        std::any_of(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p->pid() == pid; });
    return ours ? pid : -1;
  }
  void stop_nodes() { nodes_.clear(); }

  // A port free now on loopback (the kernel's pick for port 0).
  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
  }

  struct EnqueueRates {
    double single = 0, batch_1000 = 0, batch_10000 = 0, copy_1000 = 0;
  };
  // Batches of 1,000 and their floor, COPY of 1,000 rows a statement into the same table, are
  // timed in the order COPY, batches, batches, COPY, each from an empty table, and each figure is
  // the mean of its two: a machine that slows over the half minute weighs on both alike.
  EnqueueRates enqueue() {
    EnqueueRates out;
    baton::Client client(url_, schema_);
    constexpr int kSingle = 5000;
    auto t0 = Clock::now();
    for (int i = 0; i < kSingle; ++i)
      client.enqueue("noop", nlohmann::json::object());
    out.single = kSingle / std::chrono::duration<double>(Clock::now() - t0).count();
    auto batches = [&](int batch) {
      std::vector<nlohmann::json> payloads(static_cast<std::size_t>(batch),
                                           nlohmann::json{{"n", 1}});
      const int rounds = kRows / batch;
      exec("TRUNCATE jobs");
      const auto start = Clock::now();
      for (int r = 0; r < rounds; ++r)
        client.enqueue_many("noop", payloads);
      return rounds * batch / std::chrono::duration<double>(Clock::now() - start).count();
    };
    out.copy_1000 = copy() / 2;
    out.batch_1000 = batches(1000) / 2;
    out.batch_1000 += batches(1000) / 2;
    out.copy_1000 += copy() / 2;
    out.batch_10000 = batches(10000);
    exec("TRUNCATE jobs");
    return out;
  }
  // kRows jobs by COPY, 1,000 rows a statement, each statement committing on its own (as a batch
  // enqueue does): the table's indexes and column defaults, none of enqueue's checks or wake-ups.
  double copy() {
    constexpr int per = 1000;
    exec("TRUNCATE jobs");
    const std::vector<std::string> columns{"queue", "type", "payload"};
    const auto row = std::make_tuple("default", "noop", R"({"n": 1})");
    const auto start = Clock::now();
    for (int done = 0; done < kRows; done += per) {
      pqxx::nontransaction tx(*db_);
      pqxx::stream_to stream(tx, schema_ + ".jobs", columns);
      for (int i = 0; i < per; ++i)
        stream << row;
      stream.complete();
    }
    return kRows / std::chrono::duration<double>(Clock::now() - start).count();
  }
  static constexpr int kRows = 200'000;

  struct Drained {
    double rate = 0;
    double cpu_ms_per_1000 = 0;
    long long peak_rss_kb = 0;
    long long leader_changes = 0;  // from the nodes' start to the drain's end
  };

  // Queues n jobs of `type` with `payload` while the (already running) cluster's queue is
  // paused, then times 1 leader + 2 passive nodes draining them from the moment the queue is
  // resumed: node start-up is not part of the figure. Polls a cheap "any job left?".
  Drained drain(long long n, const std::string& type, const std::string& payload,
                int console_pages = 0, std::vector<double>* request_ms = nullptr) {
    console_ = console_pages > 0 ? "127.0.0.1:" + std::to_string(free_port()) : "";
    const pid_t leader = start_nodes(3);
    const long long first_epoch = count("SELECT coalesce(max(epoch), 0) FROM locks");
    // Open pages: each asks what the queues page asks every 2 s (and the cluster page's query),
    // from the moment the queue is resumed until the drain ends.
    std::atomic<bool> stop{false};
    std::vector<std::thread> pages;
    std::mutex ms_mutex;
    if (console_pages > 0) {
      const auto address = console_;
      if (!baton::test::wait_for(
              [&] { return !baton::test::http_get(address, "/api/session").empty(); }, 30s)) {
        throw std::runtime_error("the console did not answer on " + address);
      }
      for (int p = 0; p < console_pages; ++p) {
        pages.emplace_back([&, address, p] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200 * p));
          while (!stop.load()) {
            for (const char* path : {"/api/queues", "/api/series", "/api/cluster"}) {
              const auto t0 = Clock::now();
              const bool ok = !baton::test::http_get(address, path).empty();
              const double ms =
                  std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
              std::lock_guard lock(ms_mutex);
              if (ok && request_ms != nullptr) request_ms->push_back(ms);
            }
            for (int i = 0; i < 20 && !stop.load(); ++i)
              std::this_thread::sleep_for(100ms);
          }
        });
      }
    }
    exec(
        "INSERT INTO queue_state (queue, paused, updated_by) VALUES ('default', true, 'bench') "
        "ON CONFLICT (queue) DO UPDATE SET paused = true");
    exec("INSERT INTO jobs (queue, type, payload) SELECT 'default', '" + type + "', '" + payload +
         "'::jsonb FROM generate_series(1, " + std::to_string(n) + ")");
    exec("VACUUM ANALYZE jobs");
    // Each drain starts from a checkpoint, so that the one after a large drain does not share the
    // server with the writing out of the large one's pages. (That was not why such a drain ran at
    // a third of the one before it: its claims' plan was, docs/performance.md.) Needs a superuser
    // or pg_checkpoint; without, the drains run on.
    try {
      exec("CHECKPOINT");
    } catch (const pqxx::sql_error&) {
      if (!checkpoint_refused_) std::fprintf(stderr, "throughput: CHECKPOINT refused; not taken\n");
      checkpoint_refused_ = true;
    }
    const double cpu0 = cpu_seconds(leader);
    const auto t0 = Clock::now();
    {
      pqxx::work tx(*db_);
      tx.exec("UPDATE queue_state SET paused = false WHERE queue = 'default'");
      tx.exec_params("SELECT pg_notify($1, 'default')", baton::detail::jobs_channel(schema_));
      tx.commit();
    }
    const bool done = baton::test::wait_for(
        [&] { return count("SELECT count(*) FROM (SELECT 1 FROM jobs LIMIT 1) j") == 0; }, 3600s,
        20ms);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    stop.store(true);
    for (auto& t : pages)
      t.join();
    Drained d;
    if (leader_pid() != leader) {
      std::fprintf(stderr,
                   "throughput: leadership moved during the drain; its CPU figure "
                   "counts only the first leader\n");
    }
    d.cpu_ms_per_1000 = 1000 * (cpu_seconds(leader) - cpu0) / (static_cast<double>(n) / 1000);
    d.peak_rss_kb = status_kb(leader, "VmHWM");
    d.leader_changes = count("SELECT coalesce(max(epoch), 0) FROM locks") - first_epoch;
    stop_nodes();
    if (!done) throw std::runtime_error("the drain did not finish within an hour");
    d.rate = static_cast<double>(n) / secs;
    exec("TRUNCATE job_history");
    return d;
  }

  // The node runs in this process, so enqueue return and handler start are read off one clock.
  // Enqueue return to handler start, in ms, sorted. The tables are vacuumed first, as
  // autovacuum would have done on an idle cluster: right after a large drain, claims step over
  // the dead index entries it left until then.
  std::vector<double> latency() {
    exec("VACUUM ANALYZE jobs");
    exec("VACUUM ANALYZE job_history");
    std::mutex m;
    std::condition_variable cv;
    std::unordered_map<std::int64_t, Clock::time_point> started;
    baton::NodeConfig config;
    config.database_url = url_;
    config.schema = schema_;
    config.node_id = "latency";
    if (o_.threads > 0) config.threads = o_.threads;
    config.metrics_listen = "off";
    config.handle_signals = false;
    config.migrate = false;
    baton::Node node(config);
    node.handle("stamp", [&](baton::JobContext& ctx) {
      const auto now = Clock::now();
      std::lock_guard lock(m);
      started[ctx.job().id] = now;
      cv.notify_all();
    });
    std::thread runner([&] { node.run(); });
    baton::test::wait_for(
        [&] {
          return count(
                     "SELECT count(*) FROM locks WHERE client_id = 'latency' AND "
                     "expires_at > clock_timestamp()") == 1;
        },
        30s);
    baton::Client client(url_, schema_);
    std::vector<double> ms;
    for (int i = 0; i < o_.samples; ++i) {
      const auto id = client.enqueue("stamp", nlohmann::json::object());
      const auto returned = Clock::now();
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, 10s, [&] { return started.count(id) != 0; })) {
        throw std::runtime_error("job " + std::to_string(id) + " did not start within 10 s");
      }
      ms.push_back(std::chrono::duration<double, std::milli>(started[id] - returned).count());
      // Idle between samples, as the figure asks. (The longer the idle, the slower the claim
      // that follows: docs/performance.md.)
      lock.unlock();
      std::this_thread::sleep_for(o_.gap);
    }
    node.stop();
    runner.join();
    std::sort(ms.begin(), ms.end());
    return ms;
  }

  // The floor under that figure on this server: the least that any job system built on a
  // NOTIFY needs. A producer's one statement inserts a row and notifies; a listener, woken by
  // the notification, claims one row in one statement (FOR UPDATE SKIP LOCKED, its session
  // committing asynchronously as baton's claims do) and then deletes it. One round trip after
  // the notification is the least a job system can take: a notification's payload proves
  // nothing (any role that can connect may NOTIFY any channel), so what runs must be read, and
  // claimed, from the table. Enqueue return to the notification read (`notified`), and to the
  // claim's answer (`claimed`), in ms, each sorted; the same samples and gap as latency().
  struct Floor {
    std::vector<double> notified, claimed;
    int late = 0;  // samples claimed at the listener's 100 ms timeout (0 in a sound run)
  };
  // With `baton_claim`, the listener claims through baton's own claim (detail::claim_jobs, with
  // the poller's planning settings and asynchronous commit, and a lock row of its own to be
  // fenced by) from baton's jobs table, vacuumed first as latency() does: the same path with
  // baton's claim in place of the least one, to measure that claim alone.
  Floor latency_floor(bool baton_claim = false) {
    const std::string table = baton_claim ? schema_ + ".jobs" : schema_ + ".floor_jobs";
    const baton::detail::Claimer claimer{{"bench-floor", "bench"}, "bench-floor", 1};
    if (baton_claim) {
      exec("VACUUM ANALYZE " + table);
      exec("INSERT INTO " + schema_ +
           ".locks (lock_key, region, client_id, epoch, expires_at) VALUES ('bench-floor', "
           "'bench', 'bench-floor', 1, 'infinity') ON CONFLICT DO NOTHING");
    } else {
      exec("DROP TABLE IF EXISTS " + table);
      exec("CREATE TABLE " + table +
           " (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'queued', payload jsonb NOT "
           "NULL)");
    }
    std::mutex m;
    std::condition_variable cv;
    std::unordered_map<std::int64_t, std::pair<Clock::time_point, Clock::time_point>> seen;
    std::atomic<bool> stop{false};
    std::atomic<bool> listening{false};
    std::string failure;
    int late = 0;  // jobs claimed only at a timeout, not on their notification
    const std::string channel = schema_ + "_floor";
    std::thread listener([&] {
      try {
        baton::detail::ConnectOptions options{.url = url_,
                                              .schema = schema_,
                                              .application_name = "bench-floor",
                                              .synchronous_commit_off = true};
        // As the poller's claim session plans (worker::plan_claims); its timeouts are left out, as
        // nothing here waits for a row lock.
        options.generic_plans = baton_claim;
        options.order_from_index = baton_claim;
        auto conn = baton::detail::connect(options);
        struct Receiver : pqxx::notification_receiver {
          Receiver(pqxx::connection_base& c, const std::string& channel, Clock::time_point& at,
                   long& n)
              : pqxx::notification_receiver(c, channel), at_(at), n_(n) {}
          void operator()(const std::string&, int) override {
            at_ = Clock::now();
            ++n_;
          }
          Clock::time_point& at_;
          long& n_;
        };
        Clock::time_point at{};
        long notes = 0;
        long handled = 0;
        Receiver receiver(*conn, channel, at, notes);
        if (!baton_claim) {
          conn->prepare("claim", "UPDATE " + table +
                                     " SET state = 'running' WHERE id = (SELECT id FROM " + table +
                                     " WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP "
                                     "LOCKED) RETURNING id");
        }
        conn->prepare("done", "DELETE FROM " + table + " WHERE id = $1");
        {
          std::lock_guard lock(m);
          listening = true;
        }
        cv.notify_all();
        while (!stop.load()) {
          // First what libpq read off the socket during the last job's statements (libpqxx hands
          // notifications over only outside a transaction, and poll() would not see them).
          conn->get_notifs();
          bool timed_out = false;
          if (notes == handled) {
            pollfd fd{conn->sock(), POLLIN, 0};
            const int ready = ::poll(&fd, 1, 100);
            if (ready > 0) conn->get_notifs();
            if (ready > 0 && notes == handled) continue;
            // Nothing came for 100 ms: claim anyway, in case a claim found nothing (its sample,
            // if any, is counted apart).
            timed_out = notes == handled;
          }
          handled = notes;
          const auto notified = at;
          std::int64_t id = 0;
          Clock::time_point claimed;
          if (baton_claim) {
            baton::detail::ClaimFilter filter;
            filter.types = {"floor"};
            const auto jobs = baton::detail::claim_jobs(*conn, claimer, 100, filter, schema_);
            claimed = Clock::now();
            if (jobs.empty()) continue;
            id = jobs.front().job.id;
          } else {
            pqxx::nontransaction claim(*conn);
            const auto rows = claim.exec_prepared("claim");
            claimed = Clock::now();
            if (rows.empty()) continue;
            id = rows[0][0].as<std::int64_t>();
          }
          pqxx::nontransaction tx(*conn);
          {
            std::lock_guard lock(m);
            seen[id] = {notified, claimed};
            if (timed_out) ++late;
          }
          cv.notify_all();
          tx.exec_prepared("done", id);
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        failure = e.what();
        listening = true;
        cv.notify_all();
      }
    });
    Floor f;
    auto end = [&] {
      stop = true;
      listener.join();
    };
    try {
      {
        std::unique_lock lock(m);
        if (!cv.wait_for(lock, 30s, [&] { return listening.load(); })) {
          throw std::runtime_error("the floor's listener did not start within 30 s");
        }
        if (!failure.empty()) throw std::runtime_error("the floor's listener: " + failure);
      }
      auto producer = baton::detail::connect({.url = url_, .schema = schema_});
      producer->prepare("enqueue", "WITH j AS (INSERT INTO " + table +
                                       (baton_claim ? " (queue, type, payload) VALUES ('default', "
                                                      "'floor', '{}')"
                                                    : " (payload) VALUES ('{}')") +
                                       " RETURNING id) SELECT id, "
                                       "pg_notify($1, '') FROM j");
      for (int i = 0; i < o_.samples; ++i) {
        const auto id = [&] {
          pqxx::nontransaction tx(*producer);
          return tx.exec_prepared("enqueue", channel)[0][0].as<std::int64_t>();
        }();
        const auto returned = Clock::now();
        std::unique_lock lock(m);
        if (!cv.wait_for(lock, 10s, [&] { return seen.count(id) != 0 || !failure.empty(); })) {
          throw std::runtime_error("floor job " + std::to_string(id) +
                                   " was not claimed within 10 s");
        }
        if (!failure.empty()) throw std::runtime_error("the floor's listener: " + failure);
        const auto [notified, claimed] = seen[id];
        f.notified.push_back(
            std::chrono::duration<double, std::milli>(notified - returned).count());
        f.claimed.push_back(std::chrono::duration<double, std::milli>(claimed - returned).count());
        lock.unlock();
        std::this_thread::sleep_for(o_.gap);
      }
    } catch (...) {
      end();
      throw;
    }
    end();
    f.late = late;
    if (baton_claim) {
      exec("DELETE FROM " + schema_ + ".locks WHERE lock_key = 'bench-floor'");
    } else {
      exec("DROP TABLE " + table);
    }
    std::sort(f.notified.begin(), f.notified.end());
    std::sort(f.claimed.begin(), f.claimed.end());
    return f;
  }

 private:
  std::string url_;
  Options o_;
  std::string schema_, dir_;
  std::unique_ptr<pqxx::connection> db_;
  std::vector<std::unique_ptr<baton::test::Process>> nodes_;
  int starts_ = 0;
  bool checkpoint_refused_ = false;
  std::string console_;  // the last node's --console-listen, when the drain has open pages
};

}  // namespace

// Of an even count (an even --runs, or the backlog's base drains), the mean of the middle two.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// "median (min..max)" of a figure over the runs, each with `decimals` digits after the point.
std::string spread(const std::vector<double>& v, int decimals) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.*f (%.*f..%.*f)", decimals, median(v), decimals, *lo, decimals,
                *hi);
  return buf;
}

// Runs every figure o.runs times (the large backlog once) and prints medians.
void report(Bench& b, const Options& o) {
  const auto runs = static_cast<std::size_t>(std::max(1, o.runs));
  auto line = [](const char* label, const std::string& value) {
    std::printf("%-36s %s\n", label, value.c_str());
    std::fflush(stdout);
  };
  if (o.wants("enqueue")) {
    std::vector<double> single, b1k, b10k, copy1k;
    for (std::size_t r = 0; r < runs; ++r) {
      const auto e = b.enqueue();
      single.push_back(e.single);
      b1k.push_back(e.batch_1000);
      b10k.push_back(e.batch_10000);
      copy1k.push_back(e.copy_1000);
    }
    line("enqueue, single, sequential", spread(single, 0) + " jobs/s");
    figure("enqueue", {{"mode", "single"}, {"jobs_per_s", median(single)}, {"runs", single}});
    line("enqueue, batches of 1,000", spread(b1k, 0) + " jobs/s");
    figure("enqueue",
           {{"mode", "batch"}, {"batch", 1000}, {"jobs_per_s", median(b1k)}, {"runs", b1k}});
    line("enqueue, batches of 10,000", spread(b10k, 0) + " jobs/s");
    figure("enqueue",
           {{"mode", "batch"}, {"batch", 10000}, {"jobs_per_s", median(b10k)}, {"runs", b10k}});
    line("COPY, 1,000 rows a statement", spread(copy1k, 0) + " rows/s");
    figure("enqueue",
           {{"mode", "copy"}, {"batch", 1000}, {"jobs_per_s", median(copy1k)}, {"runs", copy1k}});
    std::vector<double> share;
    for (std::size_t r = 0; r < runs; ++r)
      share.push_back(b1k[r] / copy1k[r]);
    line("batches of 1,000 / COPY", spread(share, 2));
  }
  double base = 0;
  if (o.wants("drain")) {
    std::vector<double> rate, cpu, rss, changes;
    for (std::size_t r = 0; r < runs; ++r) {
      const auto d = b.drain(o.drain, "noop", "{}");
      rate.push_back(d.rate);
      changes.push_back(static_cast<double>(d.leader_changes));
      cpu.push_back(d.cpu_ms_per_1000);
      rss.push_back(static_cast<double>(d.peak_rss_kb) / 1024.0);
    }
    base = median(rate);
    line("drain, 1 leader + 2 passive", spread(rate, 0) + " jobs/s");
    figure("drain", {{"jobs", o.drain},
                     {"threads", o.threads},
                     {"batch_size", o.batch_size},
                     {"jobs_per_s", base},
                     {"runs", rate},
                     {"leader_changes", changes}});
    line("leader CPU per 1,000 jobs", spread(cpu, 2) + " ms (user + system)");
    figure("cpu", {{"jobs", o.drain}, {"leader_ms_per_1000_jobs", median(cpu)}, {"runs", cpu}});
    line("leader peak resident memory", spread(rss, 1) + " MB");
    figure("memory", {{"jobs", o.drain}, {"leader_peak_rss_mb", median(rss)}, {"runs", rss}});
    if (o.backlog > 0) {
      // The base drains run again after the large one, as many as before it, and the ratio
      // divides by the median of all of them: on a machine whose speed drifts over minutes, the
      // drain before alone made single runs of the ratio differ by ten points, and one base drain
      // on each side (a second or two each, against the large drain's minute and more) moved
      // the ratio from 71 % to 100 % over three runs whose large drains were within 9 % of each
      // other (docs/performance-log.md, 2026-12-02).
      const auto d = b.drain(o.backlog, "noop", "{}");
      std::vector<double> after, after_changes;
      for (std::size_t r = 0; r < runs; ++r) {
        const auto a = b.drain(o.drain, "noop", "{}");
        after.push_back(a.rate);
        after_changes.push_back(static_cast<double>(a.leader_changes));
      }
      std::vector<double> all = rate;
      all.insert(all.end(), after.begin(), after.end());
      const double beside = median(all);
      line("drain, large backlog", spread({d.rate}, 0) + " jobs/s");
      line("drain, base again after it", spread(after, 0) + " jobs/s");
      line("backlog rate / base rate beside it", spread({100 * d.rate / beside}, 1) + " %");
      line("leader changes, large backlog", std::to_string(d.leader_changes));
      figure("backlog", {{"jobs", o.backlog},
                         {"jobs_per_s", d.rate},
                         {"base_jobs", o.drain},
                         {"base_before_runs", rate},
                         {"base_after_runs", after},
                         {"base_jobs_per_s", beside},
                         {"ratio", d.rate / beside},
                         {"leader_changes", d.leader_changes},
                         {"base_after_leader_changes", after_changes},
                         {"lock_ttl", o.lock_ttl.empty() ? "default" : o.lock_ttl}});
    }
  }
  if (o.wants("console")) {
    // Interleaved: a drain with no page open, then one with the pages, each round.
    std::vector<double> without, with, ratio, request_ms;
    for (std::size_t r = 0; r < runs; ++r) {
      without.push_back(b.drain(o.drain, "noop", "{}").rate);
      with.push_back(b.drain(o.drain, "noop", "{}", o.console_pages, &request_ms).rate);
      ratio.push_back(with.back() / without.back());
    }
    std::sort(request_ms.begin(), request_ms.end());
    auto pct = [&](double p) {
      return request_ms.empty() ? 0.0
                                : request_ms[static_cast<std::size_t>(p * (request_ms.size() - 1))];
    };
    line("drain, no console page open", spread(without, 0) + " jobs/s");
    const auto open_pages = "drain, " + std::to_string(o.console_pages) + " console pages open";
    line(open_pages.c_str(), spread(with, 0) + " jobs/s");
    line("with pages / without", spread(ratio, 3));
    char text[160];
    std::snprintf(text, sizeof text, "p50 %.1f ms  p99 %.1f ms  (%zu requests)", pct(0.5),
                  pct(0.99), request_ms.size());
    line("console requests during the drain", text);
    figure("console", {{"jobs", o.drain},
                       {"pages", o.console_pages},
                       {"jobs_per_s_without", median(without)},
                       {"jobs_per_s_with", median(with)},
                       {"ratio", median(ratio)},
                       {"ratios", ratio},
                       {"request_p50_ms", pct(0.5)},
                       {"request_p99_ms", pct(0.99)}});
  }
  if (o.wants("sleep")) {
    std::vector<double> rate;
    for (std::size_t r = 0; r < runs; ++r)
      rate.push_back(b.drain(o.sleep_jobs, "sleep", R"({"ms": 1})").rate);
    const double ideal = o.threads * 1000.0;
    line("1 ms sleep jobs",
         spread(rate, 0) + " jobs/s, " + spread({100 * median(rate) / ideal}, 1) + " % of ideal");
    figure("sleep_jobs", {{"jobs", o.sleep_jobs},
                          {"threads", o.threads},
                          {"jobs_per_s", median(rate)},
                          {"share_of_ideal", median(rate) / ideal},
                          {"runs", rate}});
  }
  auto pct = [](const std::vector<double>& ms, double p) {
    return ms[static_cast<std::size_t>(p * (ms.size() - 1))];
  };
  if (o.wants("latency")) {
    const auto ms = b.latency();
    char text[160];
    std::snprintf(text, sizeof text, "p50 %.3f ms  p99 %.3f ms  max %.3f ms  (%zu samples)",
                  pct(ms, 0.5), pct(ms, 0.99), ms.back(), ms.size());
    line("latency, enqueue return to start", text);
    figure("latency", {{"samples", ms.size()},
                       {"gap_ms", o.gap.count()},
                       {"p50_ms", pct(ms, 0.5)},
                       {"p99_ms", pct(ms, 0.99)},
                       {"max_ms", ms.back()}});
  }
  for (const bool baton_claim : {false, true}) {
    const char* name = baton_claim ? "latency_claim" : "latency_floor";
    if (!o.wants(name)) continue;
    const auto f = b.latency_floor(baton_claim);
    const std::string what = baton_claim ? "floor, baton's claim" : "latency floor";
    char text[160];
    std::snprintf(text, sizeof text, "p50 %.3f ms  p99 %.3f ms  max %.3f ms  (%zu samples)",
                  pct(f.claimed, 0.5), pct(f.claimed, 0.99), f.claimed.back(), f.claimed.size());
    line((what + ", enqueue return to claimed").c_str(), text);
    std::snprintf(text, sizeof text, "p50 %.3f ms  p99 %.3f ms  (%d claimed late)",
                  pct(f.notified, 0.5), pct(f.notified, 0.99), f.late);
    line((what + ", enqueue return to notified").c_str(), text);
    figure(name, {{"samples", f.claimed.size()},
                  {"gap_ms", o.gap.count()},
                  {"p50_ms", pct(f.claimed, 0.5)},
                  {"p99_ms", pct(f.claimed, 0.99)},
                  {"max_ms", f.claimed.back()},
                  {"notified_p50_ms", pct(f.notified, 0.5)},
                  {"notified_p99_ms", pct(f.notified, 0.99)},
                  {"late", f.late}});
  }
}

int main(int argc, char** argv) {
  if (const int code = baton::bench::check_flag_pairs(
          argc, argv,
          "bench/throughput [--drain 100000] [--samples 1000] [--threads 16] "
          "[--batch-size 1000] [--backlog 0] [--sleep-jobs 48000] [--runs 3] "
          "[--console-pages 10] [--only "
          "enqueue,drain,sleep,latency,latency_floor,latency_claim,console] "
          "[--lock-ttl 500ms] "
          "[--gap 2ms]");
      code >= 0)
    return code;
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--drain") {
      o.drain = std::atoll(value);
    } else if (flag == "--samples") {
      o.samples = std::atoi(value);
    } else if (flag == "--threads") {
      o.threads = std::atoi(value);
    } else if (flag == "--batch-size") {
      o.batch_size = std::atoi(value);
    } else if (flag == "--backlog") {
      o.backlog = std::atoll(value);
    } else if (flag == "--sleep-jobs") {
      o.sleep_jobs = std::atoll(value);
    } else if (flag == "--runs") {
      o.runs = std::atoi(value);
    } else if (flag == "--console-pages") {
      o.console_pages = std::atoi(value);
    } else if (flag == "--only") {
      o.only = value;
    } else if (flag == "--lock-ttl") {
      try {
        (void)baton::parse_duration(value, "--lock-ttl");  // the nodes' own rule and message
      } catch (const std::exception& e) {
        std::fprintf(stderr, "throughput: %s\n", e.what());
        return 2;
      }
      o.lock_ttl = value;
    } else if (flag == "--gap") {
      try {
        o.gap = baton::parse_duration(value, "--gap");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "throughput: %s\n", e.what());
        return 2;
      }
    } else {
      std::fprintf(stderr, "throughput: unknown flag %s (see the comment at the top of %s)\n",
                   flag.c_str(), __FILE__);
      return 2;
    }
  }
  try {
    baton::test::TempDirsGuard temp_dirs;  // ends last: the server and the nodes stop first
    baton::bench::BenchDatabase database;
    Bench b(database.url(), o);
    report(b, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "throughput: %s\n", e.what());
    return 1;
  }
  return 0;
}
