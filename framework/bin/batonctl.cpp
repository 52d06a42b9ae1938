// batonctl: the operator's CLI. Exit codes: 0 ok, 1 failure (database, not found), 2 bad usage.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include <baton/baton.h>
#include <baton/detail/db.h>
#include <baton/detail/migrations.h>
#include <baton/detail/schedule.h>
#include <date/date.h>

namespace {

struct Common {
  std::string database_url;
  std::string schema = "baton";
  bool json = false;
};

std::unique_ptr<pqxx::connection> open(const Common& c) {
  if (c.database_url.empty()) {
    throw baton::ConfigError("database-url: is required; pass --database-url or set DATABASE_URL");
  }
  baton::describe_database_url(c.database_url);  // validates the form
  return baton::detail::connect(
      {.url = c.database_url, .schema = c.schema, .application_name = "batonctl"});
}

// Renders a result as aligned columns, or as a JSON array of objects.
void print(const pqxx::result& rows, bool json) {
  if (json) {
    auto out = nlohmann::json::array();
    for (const auto& r : rows) {
      nlohmann::json o;
      for (const auto& f : r) {
        constexpr pqxx::oid kBool = 16;
        if (f.is_null()) {
          o[f.name()] = nullptr;
        } else if (f.type() == kBool) {
          o[f.name()] = std::string_view(f.c_str()) == "t";
        } else {
          // Numbers and JSON come back as JSON; the rest as strings.
          auto parsed = nlohmann::json::parse(f.c_str(), nullptr, false);
          o[f.name()] =
              parsed.is_discarded() || parsed.is_string() ? nlohmann::json(f.c_str()) : parsed;
        }
      }
      out.push_back(o);
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::vector<std::size_t> width(rows.columns());
  for (pqxx::row::size_type i = 0; i < rows.columns(); ++i)
    width[i] = std::strlen(rows.column_name(i));
  for (const auto& r : rows) {
    for (pqxx::row::size_type i = 0; i < r.size(); ++i) {
      width[i] = std::max(width[i], std::strlen(r[i].is_null() ? "-" : r[i].c_str()));
    }
  }
  auto cell = [&](std::size_t i, const char* text) {
    std::printf("%-*s%s", static_cast<int>(width[i]), text, i + 1 < width.size() ? "  " : "\n");
  };
  for (pqxx::row::size_type i = 0; i < rows.columns(); ++i)
    cell(i, rows.column_name(i));
  for (const auto& r : rows) {
    for (pqxx::row::size_type i = 0; i < r.size(); ++i)
      cell(i, r[i].is_null() ? "-" : r[i].c_str());
  }
  if (rows.empty()) std::printf("(none)\n");
}

// One row, one field a line (JSON: one object), with JSON values pretty-printed.
void print_record(const pqxx::result& rows, bool json) {
  if (json) {
    print(rows, true);
    return;
  }
  for (const auto& f : rows[0]) {
    std::string value = f.is_null() ? "-" : f.c_str();
    if (!f.is_null() && (value.front() == '{' || value.front() == '[')) {
      auto parsed = nlohmann::json::parse(value, nullptr, false);
      if (!parsed.is_discarded()) value = parsed.dump(2);
    }
    std::printf("%-17s %s\n", f.name(), value.c_str());
  }
}

constexpr const char* kSchedulesSql = R"sql(
SELECT s.name, s.spec, s.type, s.queue, s.missed, s.active,
       to_char(s.last_tick, 'YYYY-MM-DD"T"HH24:MI:SSOF') AS last_tick,
       CASE WHEN s.last_job_id IS NULL THEN NULL
            WHEN EXISTS (SELECT 1 FROM job_history h WHERE h.id = s.last_job_id) THEN 'completed'
            WHEN EXISTS (SELECT 1 FROM dead_jobs d WHERE d.id = s.last_job_id) THEN 'dead'
            WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.last_job_id AND j.last_error IS NOT NULL)
              THEN 'failing'
            WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.last_job_id) THEN 'pending'
            ELSE 'pruned' END AS last_run,
       extract(epoch FROM now())::bigint AS now_epoch
  FROM periodic_schedules s ORDER BY s.name
)sql";

// Schedules, with the next tick computed from the stored spec ("every Ns" or "<cron> <tz>").
void print_schedules(pqxx::transaction_base& tx, bool json) {
  auto rows = tx.exec(kSchedulesSql);
  auto out = nlohmann::json::array();
  for (const auto& r : rows) {
    const std::string spec = r["spec"].c_str();
    std::string next = "-";
    try {
      std::unique_ptr<baton::detail::Schedule> s;
      if (spec.rfind("every ", 0) == 0) {
        s = baton::detail::every(std::chrono::seconds(std::stoll(spec.substr(6))));
      } else {
        const auto tz_at = spec.rfind(' ');
        s = baton::detail::cron(spec.substr(0, tz_at), spec.substr(tz_at + 1));
      }
      const auto now =
          baton::detail::SysSeconds(std::chrono::seconds(r["now_epoch"].as<long long>()));
      next = date::format("%FT%TZ", s->next_after(now));
    } catch (const std::exception&) {
      // A spec this binary cannot read: shown as "-".
    }
    nlohmann::json row;
    for (const char* k : {"name", "spec", "type", "queue", "missed", "last_tick", "last_run"}) {
      row[k] = r[k].is_null() ? nlohmann::json(nullptr) : nlohmann::json(r[k].c_str());
    }
    row["active"] = std::string_view(r["active"].c_str()) == "t";
    row["next_tick"] = r["active"].c_str() == std::string("t") ? next : "-";
    out.push_back(row);
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  if (out.empty()) {
    std::cout << "(no schedules)\n";
    return;
  }
  std::printf("%-16s %-26s %-7s %-26s %-22s %-10s\n", "name", "spec", "active", "last tick",
              "next tick", "last run");
  for (const auto& row : out) {
    auto text = [&](const char* k) {
      return row[k].is_null()     ? std::string("-")
             : row[k].is_string() ? row[k].get<std::string>()
                                  : row[k].dump();
    };
    std::printf("%-16s %-26s %-7s %-26s %-22s %-10s\n", text("name").c_str(), text("spec").c_str(),
                text("active").c_str(), text("last_tick").c_str(), text("next_tick").c_str(),
                text("last_run").c_str());
  }
}

constexpr const char* kSagasListSql = R"sql(
SELECT s.id, s.type, s.version,
       (SELECT string_agg(i.property || '=' || i.value, ' ' ORDER BY i.property)
          FROM saga_index i WHERE i.saga_id = s.id) AS indexed,
       to_char(s.updated_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS updated_at,
       to_char(s.completed_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS completed_at
  FROM sagas s
 WHERE ($1 = '' OR s.type = $1) AND ($2 OR s.completed_at IS NULL)
 ORDER BY s.updated_at DESC LIMIT $3
)sql";

constexpr const char* kSagaShowSql = R"sql(
SELECT id, type, version, created_at, updated_at, completed_at,
       (SELECT jsonb_object_agg(property, value) FROM saga_index WHERE saga_id = s.id) AS indexed,
       data
  FROM sagas s WHERE id::text = $1
)sql";

// Enqueues JSON lines in batches of 1,000, with a progress line when stderr is a terminal.
int enqueue_lines(const Common& c, const std::string& path, const std::string& type,
                  const std::string& queue) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) throw baton::EnqueueError("--file: cannot read " + path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  baton::Client client(c.database_url, c.schema);
  const bool tty = isatty(2) != 0;
  std::vector<baton::NewJob> batch;
  long long total = 0, line_no = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    total += static_cast<long long>(client.enqueue_batch(batch).size());
    batch.clear();
    if (tty) std::fprintf(stderr, "\renqueued %lld jobs", total);
  };
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      throw baton::EnqueueError("line " + std::to_string(line_no) +
                                " is not JSON: " + line.substr(0, 80));
    }
    baton::NewJob job;
    job.options.queue = queue;
    if (!type.empty()) {
      job.type = type;
      job.payload = j;
    } else {
      if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
        throw baton::EnqueueError("line " + std::to_string(line_no) +
                                  " has no \"type\"; give each line a type or pass --type");
      }
      job.type = j["type"];
      job.payload = j.value("payload", nlohmann::json::object());
      job.options.queue = j.value("queue", queue);
      job.options.priority = j.value("priority", 0);
      job.options.max_attempts = j.value("max_attempts", 10);
      job.options.delay = std::chrono::milliseconds(j.value("delay_ms", 0LL));
      job.options.partition_key = j.value("partition_key", "");
      job.options.idempotency_key = j.value("idempotency_key", "");
    }
    batch.push_back(std::move(job));
    if (batch.size() == 1000) flush();
  }
  flush();
  if (tty) std::fprintf(stderr, "\n");
  if (c.json) {
    std::cout << nlohmann::json{{"enqueued", total}, {"lines", line_no}} << "\n";
  } else {
    std::cout << "enqueued " << total << " job(s) from " << line_no << " line(s)\n";
  }
  return 0;
}

// The failover drill: fault the leader, then report when the next one was granted and started
// its first job, on the database clock.
int run_drill(const Common& c, bool kill_it, baton::Millis timeout) {
  auto conn = open(c);
  baton::detail::require_current_schema(*conn, c.schema);
  auto value = [&](const std::string& sql) {
    pqxx::nontransaction tx(*conn);
    auto r = tx.exec(sql);
    return r.empty() || r[0][0].is_null() ? std::string() : std::string(r[0][0].c_str());
  };
  const std::string leader =
      value("SELECT client_id FROM locks WHERE expires_at > clock_timestamp()");
  if (leader.empty()) {
    std::cerr << "batonctl: no node leads now; start nodes first (batonctl nodes)\n";
    return 1;
  }
  const std::string epoch = value("SELECT epoch FROM locks");
  const std::string t0 = value("SELECT clock_timestamp()::text");
  const bool tty = isatty(1) != 0 && !c.json;
  std::ostringstream quiet;  // with --json, the timeline is not printed
  std::ostream& out = c.json ? quiet : std::cout;
  if (kill_it) {
    std::string pid, host_of;
    {
      pqxx::nontransaction tx(*conn);
      auto r = tx.exec_params("SELECT pid, host FROM nodes WHERE node_id = $1", leader);
      if (!r.empty()) {
        pid = r[0][0].c_str();
        host_of = r[0][1].c_str();
      }
    }
    std::array<char, 256> host{};
    gethostname(host.data(), host.size() - 1);
    if (pid.empty() || host_of != host.data()) {
      std::cerr << "batonctl: " << leader << " runs on another host; --kill works on this host "
                << "only (run the drill without --kill to ask it to step down)\n";
      return 1;
    }
    ::kill(std::stoi(pid), SIGKILL);
    out << "+0 ms      killed " << leader << " (epoch " << epoch << ", pid " << pid << ")\n";
  } else {
    pqxx::work tx(*conn);
    tx.exec_params("SELECT pg_notify($1, $2)", baton::detail::leader_channel(c.schema),
                   "yield " + leader);
    tx.commit();
    out << "+0 ms      asked " << leader << " (epoch " << epoch << ") to step down\n";
  }
  baton::Client(c.database_url, c.schema).enqueue("baton.drill", nlohmann::json::object());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto ms_since = [&](const std::string& sql) {
    return value("SELECT round(extract(epoch FROM (" + sql + ") - '" + t0 +
                 "'::timestamptz) * 1000)");
  };
  auto line = [&out](const std::string& ms, const std::string& what) {
    std::string head = "+" + ms + " ms";
    head.resize(std::max<std::size_t>(head.size() + 1, 11), ' ');
    out << head << what << "\n";
  };
  std::string granted, started;
  while (std::chrono::steady_clock::now() < deadline) {
    if (granted.empty() && value("SELECT epoch > " + epoch + " FROM locks") == "t") {
      granted = ms_since("SELECT created_date FROM locks");
      if (tty) std::cout << "\r";
      line(granted, "leader " + value("SELECT client_id FROM locks") + " granted epoch " +
                        value("SELECT epoch FROM locks"));
    }
    if (!granted.empty()) {
      started =
          ms_since("SELECT least((SELECT min(started_at) FROM job_history WHERE epoch > " + epoch +
                   "), (SELECT min(claimed_at) FROM jobs WHERE claimed_epoch > " + epoch + "))");
      if (!started.empty()) break;
    }
    if (tty) {
      std::cout << "\rwaiting for " << (granted.empty() ? "a new leader" : "its first job") << "..."
                << std::flush;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (tty) std::cout << "\r";
  if (started.empty()) {
    out << (granted.empty() ? "no new leader" : "no job started") << " within " << timeout.count()
        << " ms\n";
    return 1;
  }
  line(started, "first job started under the new leader");
  out << "failover took " << started << " ms (fault to first job)\n";
  if (c.json) {
    std::cout << nlohmann::json{{"leader", leader},
                                {"killed", kill_it},
                                {"granted_ms", std::stoll(granted)},
                                {"first_job_ms", std::stoll(started)}}
              << "\n";
  }
  return 0;
}

constexpr const char* kStatsSql = R"sql(
WITH recent AS (
  SELECT queue,
         count(*) FILTER (WHERE finished_at > now() - interval '1 minute') AS done_1m,
         count(*) FILTER (WHERE finished_at > now() - interval '15 minutes') AS done_15m,
         round((percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at)))::numeric, 3) AS wait_p50_s,
         round((percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at)))::numeric, 3) AS wait_p95_s,
         round((percentile_cont(0.5) WITHIN GROUP (ORDER BY run_seconds))::numeric, 3) AS run_p50_s,
         round((percentile_cont(0.95) WITHIN GROUP (ORDER BY run_seconds))::numeric, 3) AS run_p95_s
    FROM job_history WHERE finished_at > now() - interval '15 minutes' GROUP BY queue),
failed AS (
  SELECT queue,
         count(*) FILTER (WHERE died_at > now() - interval '1 minute') AS dead_1m,
         count(*) FILTER (WHERE died_at > now() - interval '15 minutes') AS dead_15m
    FROM dead_jobs WHERE died_at > now() - interval '15 minutes' GROUP BY queue),
live AS (
  SELECT queue,
         count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
         count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
         count(*) FILTER (WHERE state = 'running') AS running,
         extract(epoch FROM now() - min(run_at) FILTER (
           WHERE state = 'available' AND run_at <= now()))::numeric(12, 3) AS oldest_available_s
    FROM jobs GROUP BY queue),
hist AS (SELECT queue, count(*) AS completed FROM job_history GROUP BY queue),
dead AS (SELECT queue, count(*) AS dead FROM dead_jobs GROUP BY queue)
SELECT q.queue, coalesce(l.available, 0) AS available, coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.running, 0) AS running, coalesce(h.completed, 0) AS completed,
       coalesce(d.dead, 0) AS dead, l.oldest_available_s,
       coalesce(r.done_1m, 0) AS completed_1m, coalesce(r.done_15m, 0) AS completed_15m,
       coalesce(f.dead_1m, 0) AS dead_1m, coalesce(f.dead_15m, 0) AS dead_15m,
       r.wait_p50_s, r.wait_p95_s, r.run_p50_s, r.run_p95_s
  FROM (SELECT queue FROM live UNION SELECT queue FROM hist UNION SELECT queue FROM dead) q
  LEFT JOIN live l USING (queue) LEFT JOIN hist h USING (queue) LEFT JOIN dead d USING (queue)
  LEFT JOIN recent r USING (queue) LEFT JOIN failed f USING (queue)
 ORDER BY q.queue
)sql";

constexpr const char* kLeaderSql = R"sql(
SELECT l.client_id AS leader, l.epoch, l.region, l.lock_key,
       to_char(l.created_date, 'YYYY-MM-DD"T"HH24:MI:SS.MSOF') AS since,
       round(extract(epoch FROM clock_timestamp() - l.renewed_at)::numeric, 3) AS renewed_s_ago,
       l.expires_at > clock_timestamp() AS lease_valid, l.holder_host AS host,
       n.metrics_addr
  FROM locks l LEFT JOIN nodes n ON n.node_id = l.client_id
 ORDER BY l.lock_key, l.region
)sql";

constexpr const char* kNodesSql = R"sql(
SELECT node_id, host, pid, role, epoch, version,
       round(extract(epoch FROM now() - last_seen)::numeric, 1) AS last_seen_s_ago,
       CASE WHEN role = 'stopped' THEN 'stopped'
            WHEN last_seen > now() - interval '10 seconds' THEN 'live' ELSE 'dead' END AS status,
       metrics_addr
  FROM nodes
 WHERE last_seen > now() - interval '1 hour'
 ORDER BY node_id
)sql";

constexpr const char* kDeadShowSql = R"sql(
SELECT id, queue, type, partition_key, payload, priority, attempts, max_attempts, reason,
       created_at, first_started_at, died_at, node, epoch, last_error, errors
  FROM dead_jobs WHERE id = $1
)sql";

// Back to the queue under the same id, with fresh attempts; the error history stays.
constexpr const char* kDeadRetrySql = R"sql(
WITH d AS (
  DELETE FROM dead_jobs
   WHERE (id = $1 OR ($1 = 0 AND ($2 = '' OR queue = $2)))
  RETURNING *),
ins AS (
  INSERT INTO jobs (id, queue, partition_key, partition, type, payload, priority, max_attempts,
                    created_at, errors)
  OVERRIDING SYSTEM VALUE
  SELECT id, queue, partition_key, job_partition(queue, partition_key), type, payload, priority,
         max_attempts, created_at, errors
    FROM d
  RETURNING id, queue),
wake AS (SELECT count(pg_notify($3, q)) AS n FROM (SELECT DISTINCT queue AS q FROM ins) x)
SELECT count(*) FROM ins WHERE (SELECT n FROM wake) >= 0
)sql";

constexpr const char* kDeadPurgeSql = R"sql(
DELETE FROM dead_jobs WHERE died_at < now() - $1::bigint * interval '1 millisecond'
   AND ($2 = '' OR queue = $2)
)sql";

constexpr const char* kJobShowSql = R"sql(
SELECT 'live' AS status, id, queue, type, partition_key, partition, payload, priority, state,
       run_at, attempts, max_attempts, created_at, first_started_at, claimed_at, claimed_by,
       claimed_epoch, last_error, errors
  FROM jobs WHERE id = $1
)sql";

constexpr const char* kHistoryShowSql = R"sql(
SELECT 'finished' AS status, id, queue, type, partition_key, payload, priority, attempts,
       created_at, run_at, first_started_at, started_at, finished_at, run_seconds, node, epoch,
       outcome
  FROM job_history WHERE id = $1
)sql";

constexpr const char* kQueueStateSql = R"sql(
INSERT INTO queue_state (queue, paused, updated_by) VALUES ($1, $2, 'batonctl')
ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused, updated_at = now(),
                                  updated_by = excluded.updated_by
)sql";

constexpr const char* kQueueListSql = R"sql(
SELECT q.queue, coalesce(s.paused, false) AS paused,
       (SELECT count(*) FROM jobs j WHERE j.queue = q.queue) AS jobs
  FROM (SELECT queue FROM jobs UNION SELECT queue FROM queue_state) q
  LEFT JOIN queue_state s USING (queue)
 ORDER BY q.queue
)sql";

constexpr const char* kDeadListSql = R"sql(
SELECT id, queue, type, attempts, reason, to_char(died_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS died_at,
       left(last_error, 120) AS last_error
  FROM dead_jobs WHERE ($1 = '' OR queue = $1) ORDER BY died_at DESC, id DESC LIMIT $2
)sql";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"batonctl: operate a baton cluster (migrate, enqueue, stats, leader, nodes, dead)"};
  app.require_subcommand(1);
  Common c;
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read once, before any thread starts
  if (const char* url = std::getenv("DATABASE_URL")) c.database_url = url;
  app.add_option("--database-url", c.database_url,
                 "libpq connection string; default $DATABASE_URL");
  app.add_option("--schema", c.schema, "schema holding baton's tables (the last one given wins)")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--json", c.json, "print JSON instead of a table");

  auto* migrate =
      app.add_subcommand("migrate", "apply pending migrations (safe to run concurrently)");

  auto* enqueue = app.add_subcommand("enqueue", "enqueue jobs");
  std::string type, payload = "{}";
  baton::EnqueueOptions opts;
  int count = 1;
  std::string delay = "0ms";
  std::string jobs_file;
  enqueue->add_option("--type", type, "job type (with --file: the type of every line)");
  enqueue->add_option("--file", jobs_file,
                      "JSON lines to enqueue, - for stdin: each line a job object (type, payload, "
                      "queue, priority, delay_ms, ...) or, with --type, a payload");
  enqueue->add_option("--payload", payload, "JSON payload")->capture_default_str();
  enqueue->add_option("--queue", opts.queue, "queue")->capture_default_str();
  enqueue->add_option("--count", count, "how many copies")->capture_default_str();
  enqueue->add_option("--priority", opts.priority, "lower runs first")->capture_default_str();
  enqueue->add_option("--delay", delay, "run after this long (e.g. 30s)")->capture_default_str();
  enqueue->add_option("--max-attempts", opts.max_attempts, "attempts before dead-lettering")
      ->capture_default_str();

  auto* drill = app.add_subcommand(
      "drill", "failover drill: ask the leader to step down (or --kill it) and time the takeover");
  bool drill_kill = false;
  std::string drill_timeout = "30s";
  drill->add_flag("--kill", drill_kill, "kill -9 the leader (it must run on this host)");
  drill->add_option("--timeout", drill_timeout, "give up after this long")->capture_default_str();

  auto* stats =
      app.add_subcommand("stats", "per queue: available, scheduled, running, completed, dead");
  auto* leader = app.add_subcommand("leader", "the current leader, its epoch and lease");
  bool step_down = false;
  leader->add_flag("--step-down", step_down,
                   "ask the leader to drain and step down (a follower takes over)");
  auto* nodes = app.add_subcommand("nodes", "nodes seen in the last hour, live or dead");
  auto* queue = app.add_subcommand("queue", "pause, resume or list queues");
  queue->require_subcommand(1);
  std::string queue_name;
  auto* queue_pause = queue->add_subcommand("pause", "the leader stops claiming NAME's jobs");
  queue_pause->add_option("name", queue_name, "queue")->required();
  auto* queue_resume = queue->add_subcommand("resume", "the leader claims NAME's jobs again");
  queue_resume->add_option("name", queue_name, "queue")->required();
  auto* queue_list = queue->add_subcommand("list", "queues with jobs, and whether paused");
  auto* queue_ordered = queue->add_subcommand(
      "ordered", "declare NAME ordered: jobs with one partition key run one at a time, in order");
  int partitions = 0;
  queue_ordered->add_option("name", queue_name, "queue")->required();
  queue_ordered->add_option("--partitions", partitions, "partition count (1..4096)")->required();

  auto* jobs = app.add_subcommand("jobs", "one job, live or finished");
  jobs->require_subcommand(1);
  auto* jobs_show = jobs->add_subcommand("show", "a job by id, from the queue or history");
  std::int64_t job_id = 0;
  jobs_show->add_option("id", job_id, "job id")->required();

  auto* schedules = app.add_subcommand(
      "schedules", "periodic schedules: last and next tick, and how the last run went");

  int limit = 50;
  auto* sagas = app.add_subcommand("sagas", "saga state");
  sagas->require_subcommand(1);
  auto* sagas_list = sagas->add_subcommand("list", "sagas, newest first, with their index values");
  std::string saga_type, saga_id;
  bool with_completed = false;
  sagas_list->add_option("--type", saga_type, "only this saga type");
  sagas_list->add_flag("--completed", with_completed, "include completed sagas");
  sagas_list->add_option("--limit", limit, "most rows")->capture_default_str();
  auto* sagas_show = sagas->add_subcommand("show", "one saga with its data pretty-printed");
  sagas_show->add_option("id", saga_id, "saga id (uuid)")->required();

  auto* dead = app.add_subcommand("dead", "dead-lettered jobs");
  dead->require_subcommand(1);
  auto* dead_list = dead->add_subcommand("list", "list dead jobs, newest first");
  std::string dead_queue;
  dead_list->add_option("--queue", dead_queue, "only this queue");
  dead_list->add_option("--limit", limit, "most rows")->capture_default_str();
  auto* dead_show = dead->add_subcommand("show", "one dead job with its payload and every error");
  dead_show->add_option("id", job_id, "job id")->required();
  auto* dead_retry = dead->add_subcommand("retry", "put dead jobs back in the queue (same id)");
  bool dead_all = false;
  dead_retry->add_option("id", job_id, "job id");
  dead_retry->add_flag("--all", dead_all, "every dead job (of --queue)");
  dead_retry->add_option("--queue", dead_queue, "only this queue (with --all)");
  auto* dead_purge = dead->add_subcommand("purge", "delete dead jobs older than a duration");
  std::string older_than;
  dead_purge->add_option("--older-than", older_than, "e.g. 30d as 720h, 7d as 168h")->required();
  dead_purge->add_option("--queue", dead_queue, "only this queue");

  CLI11_PARSE(app, argc, argv);

  try {
    if (migrate->parsed()) {
      auto conn = open(c);
      const int applied = baton::detail::migrate(*conn, c.schema);
      const int version = baton::detail::current_schema_version(*conn, c.schema);
      if (c.json) {
        std::cout << nlohmann::json{{"schema", c.schema},
                                    {"version", version},
                                    {"applied", applied}}
                  << "\n";
      } else {
        std::cout << "schema " << c.schema << " is at version " << version << " (applied "
                  << applied << " migration(s))\n";
      }
    } else if (enqueue->parsed() && !jobs_file.empty()) {
      if (c.database_url.empty()) open(c);
      return enqueue_lines(c, jobs_file, type, opts.queue);
    } else if (drill->parsed()) {
      return run_drill(c, drill_kill, baton::parse_duration(drill_timeout, "timeout"));
    } else if (enqueue->parsed()) {
      if (type.empty()) throw baton::EnqueueError("enqueue needs --type (or --file)");
      opts.delay = baton::parse_duration(delay, "delay");
      nlohmann::json body = nlohmann::json::parse(payload, nullptr, false);
      if (body.is_discarded()) {
        throw baton::EnqueueError("--payload is not valid JSON: " + payload);
      }
      if (c.database_url.empty()) open(c);  // the same clear error as the other commands
      baton::Client client(c.database_url, c.schema);
      auto ids = count == 1 ? std::vector<std::int64_t>{client.enqueue(type, body, opts)}
                            : client.enqueue_copies(type, body, count, opts);
      if (c.json) {
        std::cout << nlohmann::json{{"enqueued", ids.size()},
                                    {"first_id", ids.front()},
                                    {"last_id", ids.back()}}
                  << "\n";
      } else {
        std::cout << "enqueued " << ids.size() << " job(s) of type " << type << " in queue "
                  << opts.queue << " (ids " << ids.front() << ".." << ids.back() << ")\n";
      }
    } else {
      auto conn = open(c);
      baton::detail::require_current_schema(*conn, c.schema);
      pqxx::work tx(*conn);  // read-only but for the step-down NOTIFY, sent at commit
      if (stats->parsed()) print(tx.exec(kStatsSql), c.json);
      if (leader->parsed() && step_down) {
        auto rows = tx.exec(kLeaderSql);
        if (rows.empty() || std::string_view(rows[0]["lease_valid"].c_str()) != "t") {
          std::cerr << "batonctl: no node leads now; nothing to step down\n";
          return 1;
        }
        const std::string who = rows[0]["leader"].c_str();
        tx.exec_params("SELECT pg_notify($1, $2)", baton::detail::leader_channel(c.schema),
                       "yield " + who);
        std::cout << "asked " << who << " (epoch " << rows[0]["epoch"].c_str()
                  << ") to step down\n";
      } else if (leader->parsed()) {
        auto rows = tx.exec(kLeaderSql);
        if (rows.empty() && !c.json) {
          std::cout << "no node has led yet\n";
        } else {
          print(rows, c.json);
        }
      }
      if (nodes->parsed()) print(tx.exec(kNodesSql), c.json);
      if (schedules->parsed()) print_schedules(tx, c.json);
      if (sagas_list->parsed()) {
        print(tx.exec_params(kSagasListSql, saga_type, with_completed, limit), c.json);
      }
      // Prints one record, or says what was not found (exit status 1).
      auto show = [&](const pqxx::result& rows, const std::string& missing) {
        if (rows.empty()) {
          std::cerr << "batonctl: no " << missing << "\n";
          return false;
        }
        print_record(rows, c.json);
        return true;
      };
      if (sagas_show->parsed() && !show(tx.exec_params(kSagaShowSql, saga_id), "saga " + saga_id)) {
        return 1;
      }
      if (queue_pause->parsed() || queue_resume->parsed()) {
        baton::validate_name("queue", queue_name);
        const bool pause = queue_pause->parsed();
        tx.exec_params(kQueueStateSql, queue_name, pause);
        // Wakes the leader's poller, so a resumed queue's jobs start at once.
        tx.exec_params("SELECT pg_notify($1, $2)", baton::detail::jobs_channel(c.schema),
                       queue_name);
        if (c.json) {
          std::cout << nlohmann::json{{"queue", queue_name}, {"paused", pause}} << "\n";
        } else {
          std::cout << "queue " << queue_name << (pause ? " paused" : " resumed")
                    << (pause ? ": the leader claims none of its jobs until resumed\n" : "\n");
        }
      }
      if (queue_list->parsed()) print(tx.exec(kQueueListSql), c.json);
      if (queue_ordered->parsed()) {
        // The Client's declaration checks the name and the count, as for any producer.
        baton::Client(c.database_url, c.schema).declare_ordered_queue(queue_name, partitions);
        std::cout << "queue " << queue_name << " is ordered with " << partitions
                  << " partitions: jobs with one partition_key run one at a time, in order\n";
      }
      if (jobs_show->parsed()) {
        auto rows = tx.exec_params(kJobShowSql, job_id);
        if (rows.empty()) rows = tx.exec_params(kHistoryShowSql, job_id);
        if (rows.empty()) rows = tx.exec_params(kDeadShowSql, job_id);
        if (!show(rows, "job " + std::to_string(job_id) + " in the queue, history or dead jobs")) {
          return 1;
        }
      }
      if (dead_show->parsed() &&
          !show(tx.exec_params(kDeadShowSql, job_id), "dead job " + std::to_string(job_id))) {
        return 1;
      }
      if (dead_retry->parsed()) {
        if ((job_id == 0) == !dead_all) {
          throw baton::EnqueueError("dead retry takes a job id or --all (not both)");
        }
        if (!dead_queue.empty()) baton::validate_name("queue", dead_queue);
        const auto n = tx.exec_params(kDeadRetrySql, dead_all ? 0 : job_id, dead_queue,
                                      baton::detail::jobs_channel(c.schema))[0][0]
                           .as<long long>();
        if (n == 0 && !dead_all) {
          std::cerr << "batonctl: no dead job " << job_id << "\n";
          return 1;
        }
        if (c.json) {
          std::cout << nlohmann::json{{"requeued", n}} << "\n";
        } else {
          std::cout << "requeued " << n << " dead job(s) with fresh attempts\n";
        }
      }
      if (dead_purge->parsed()) {
        if (!dead_queue.empty()) baton::validate_name("queue", dead_queue);
        const auto age = baton::parse_duration(older_than, "older-than");
        const auto n =
            tx.exec_params(kDeadPurgeSql, static_cast<std::int64_t>(age.count()), dead_queue)
                .affected_rows();
        if (c.json) {
          std::cout << nlohmann::json{{"purged", n}} << "\n";
        } else {
          std::cout << "purged " << n << " dead job(s) older than " << older_than << "\n";
        }
      }
      if (dead_list->parsed()) print(tx.exec_params(kDeadListSql, dead_queue, limit), c.json);
      tx.commit();
    }
  } catch (const baton::ConfigError& e) {
    std::cerr << "batonctl: bad setting: " << e.what() << "\n";
    return 2;
  } catch (const baton::EnqueueError& e) {
    std::cerr << "batonctl: " << baton::detail::scrub(e.what()) << "\n";
    return 2;
  } catch (const pqxx::broken_connection& e) {
    std::cerr << "batonctl: cannot reach the database: " << baton::detail::scrub(e.what())
              << "check --database-url / DATABASE_URL and that PostgreSQL is running\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "batonctl: " << baton::detail::scrub(e.what()) << "\n";
    return 1;
  }
  return 0;
}
