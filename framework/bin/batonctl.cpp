// batonctl: the operator's CLI. Exit codes: 0 ok, 1 failure (database, not found), 2 bad usage.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <nlohmann/json.hpp>

#include <baton/baton.h>
#include <baton/detail/db.h>
#include <baton/detail/migrations.h>

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

constexpr const char* kStatsSql = R"sql(
WITH live AS (
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
       coalesce(d.dead, 0) AS dead, l.oldest_available_s
  FROM (SELECT queue FROM live UNION SELECT queue FROM hist UNION SELECT queue FROM dead) q
  LEFT JOIN live l USING (queue) LEFT JOIN hist h USING (queue) LEFT JOIN dead d USING (queue)
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
  if (const char* url = std::getenv("DATABASE_URL")) c.database_url = url;
  app.add_option("--database-url", c.database_url,
                 "libpq connection string; default $DATABASE_URL");
  app.add_option("--schema", c.schema, "schema holding baton's tables")->capture_default_str();
  app.add_flag("--json", c.json, "print JSON instead of a table");

  auto* migrate =
      app.add_subcommand("migrate", "apply pending migrations (safe to run concurrently)");

  auto* enqueue = app.add_subcommand("enqueue", "enqueue jobs");
  std::string type, payload = "{}";
  baton::EnqueueOptions opts;
  int count = 1;
  std::string delay = "0ms";
  enqueue->add_option("--type", type, "job type")->required();
  enqueue->add_option("--payload", payload, "JSON payload")->capture_default_str();
  enqueue->add_option("--queue", opts.queue, "queue")->capture_default_str();
  enqueue->add_option("--count", count, "how many copies")->capture_default_str();
  enqueue->add_option("--priority", opts.priority, "lower runs first")->capture_default_str();
  enqueue->add_option("--delay", delay, "run after this long (e.g. 30s)")->capture_default_str();
  enqueue->add_option("--max-attempts", opts.max_attempts, "attempts before dead-lettering")
      ->capture_default_str();

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

  auto* dead = app.add_subcommand("dead", "dead-lettered jobs");
  dead->require_subcommand(1);
  auto* dead_list = dead->add_subcommand("list", "list dead jobs, newest first");
  std::string dead_queue;
  int limit = 50;
  dead_list->add_option("--queue", dead_queue, "only this queue");
  dead_list->add_option("--limit", limit, "most rows")->capture_default_str();

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
    } else if (enqueue->parsed()) {
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
      if (dead_list->parsed()) print(tx.exec_params(kDeadListSql, dead_queue, limit), c.json);
      tx.commit();
    }
  } catch (const baton::ConfigError& e) {
    std::cerr << "batonctl: bad setting: " << e.what() << "\n";
    return 2;
  } catch (const baton::EnqueueError& e) {
    std::cerr << "batonctl: " << e.what() << "\n";
    return 2;
  } catch (const pqxx::broken_connection& e) {
    std::cerr << "batonctl: cannot reach the database: " << e.what()
              << "check --database-url / DATABASE_URL and that PostgreSQL is running\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "batonctl: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
