// bench/claim_parts: what each part of baton's claim adds to an idle job's wait, measured on one
// server with the parts interleaved job by job. A producer's statement inserts a job and
// notifies; a listener, woken, claims it; the figure is the producer's answer to the claim's
// answer, as in bench/throughput's latency_floor. The listener claims through a ladder of
// statements, each adding one part to the one before:
//   floor          the least claim (FOR UPDATE SKIP LOCKED) from a table of three columns (its
//                  update of state is a HOT update: no index names state)
//   not HOT        the same from a copy of that table with two partial indexes by state, one
//                  for waiting jobs (which the claim reads) and one for running jobs: its update
//                  is not HOT, and writes the two index entries baton's claim of a job without
//                  a timeout writes (the primary key's and the running index's)
//   jobs table     the same claim from baton's jobs table (its columns and six indexes)
//   claim shape    baton's claim with its four conditions taken out, returning the id
//   + fence        the lock row's epoch
//   + filters      the node's queues and types
//   + paused       paused queues
//   + partitions   ordered partitions: baton's conditions, returning the id
//   + columns      what baton's claim returns: baton's claim as the poller prepares it
//   again          the same statement once more, on a listener of its own: its step is what two
//                  identical rungs differ by (each listener is a server process of its own), the
//                  bench's resolution; a step below it is not told apart from nothing
// The rungs from "claim shape" up are cut from the library's own claim statement
// (detail::claim_statement); the bench stops if a part is no longer found in it. Each listener
// is a session of its own, set as the poller's claim session is (worker::with_claim_session:
// generic plans, no JIT, asynchronous commit, its timeouts), on a channel of its own; one thread
// drives producer and listeners, so the notification is on the listener's socket when the
// producer's answer comes back. Each round takes --samples jobs through every rung, in a new random
// order for each job; the figures are medians over --rounds rounds of each round's median (p50),
// with their range, and of each step (a rung's p50 less the rung's below, in the same round).
//   bench/claim_parts [--rounds 5] [--samples 200] [--gap 2ms]
// --gap is the idle time after each claim (bench/throughput's latency bench waits as long).
// Uses DATABASE_URL when set, else a throwaway PostgreSQL. About 30 s with the defaults.
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <baton/baton.h>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/migrations.h"
#include "bench_db.h"
#include "worker/poller.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Rung {
  std::string name;
  std::string enqueue;  // notifies on $1
  std::string claim;    // claim_jobs' ten parameters; returns the job's id first
  std::string done;     // $1 the id
};

struct PgConnDeleter {
  void operator()(PGconn* c) const { PQfinish(c); }
};
using Conn = std::unique_ptr<PGconn, PgConnDeleter>;

struct PgResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, PgResultDeleter>;

Result checked(PGconn* c, PGresult* r, const std::string& what) {
  Result out(r);
  const auto status = PQresultStatus(r);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error(what + ": " + PQerrorMessage(c));
  }
  return out;
}

Conn open(const std::string& url, const std::string& settings) {
  Conn c(PQconnectdb(url.c_str()));
  if (PQstatus(c.get()) != CONNECTION_OK) {
    throw std::runtime_error(std::string("cannot connect: ") + PQerrorMessage(c.get()));
  }
  checked(c.get(), PQexec(c.get(), settings.c_str()), "session settings");
  return c;
}

// The claim statement without its comments and with its white space made single, so that the
// parts below are found whatever the source's layout.
std::string normalized(const std::string& sql) {
  const std::string plain = std::regex_replace(sql, std::regex("--[^\n]*"), " ");
  std::string out = std::regex_replace(plain, std::regex("\\s+"), " ");
  if (!out.empty() && out.front() == ' ') out.erase(0, 1);
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string without(std::string sql, const std::string& part, const char* what) {
  const auto at = sql.find(part);
  if (at == std::string::npos) {
    throw std::runtime_error(std::string("baton's claim no longer holds its ") + what +
                             " condition as this bench knows it (" + part +
                             "): update bench/claim_parts.cpp");
  }
  sql.erase(at, part.size());
  return sql;
}

std::vector<Rung> ladder() {
  const std::string verbatim = baton::detail::claim_statement(false, false);
  const std::string sql = normalized(verbatim);
  const auto returning = sql.find(" RETURNING ");
  if (returning == std::string::npos) {
    throw std::runtime_error("baton's claim has no RETURNING: update bench/claim_parts.cpp");
  }
  const std::string conditions = sql.substr(0, returning) + " RETURNING j.id";
  struct Part {
    const char* what;
    std::vector<std::string> text;
  };
  const std::vector<Part> parts = {
      {"fence",
       {"AND EXISTS (SELECT 1 FROM locks WHERE lock_key = $3 AND region = $4 AND client_id = $1 "
        "AND epoch = $2) "}},
      {"filters",
       {"AND (cardinality($5::text[]) = 0 OR queue = ANY ($5::text[])) ",
        "AND NOT (queue = ANY ($7::text[])) ", "AND type COLLATE \"C\" = ANY ($9::text[]) "}},
      {"paused",
       {"AND (NOT EXISTS (SELECT 1 FROM queue_state WHERE paused) OR NOT EXISTS (SELECT 1 FROM "
        "queue_state s WHERE s.queue = jobs.queue AND s.paused)) "}},
      {"partitions",
       {"AND (partition IS NULL OR id = (SELECT min(f.id) FROM jobs f WHERE f.queue = jobs.queue "
        "AND f.partition = jobs.partition)) "}},
  };
  const std::string enqueue_jobs =
      "WITH j AS (INSERT INTO jobs (queue, type, payload) VALUES ('default', 'parts', '{}') "
      "RETURNING id) SELECT id, pg_catalog.pg_notify($1, '') FROM j";
  const std::string done_jobs = "DELETE FROM jobs WHERE id = $1";
  std::vector<Rung> out;
  out.push_back({"floor",
                 "WITH j AS (INSERT INTO parts_floor (payload) VALUES ('{}') RETURNING id) "
                 "SELECT id, pg_catalog.pg_notify($1, '') FROM j",
                 "UPDATE parts_floor SET state = 'running' WHERE id = (SELECT id FROM "
                 "parts_floor WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) "
                 "RETURNING id",
                 "DELETE FROM parts_floor WHERE id = $1"});
  out.push_back({"not HOT",
                 "WITH j AS (INSERT INTO parts_indexed (payload) VALUES ('{}') RETURNING id) "
                 "SELECT id, pg_catalog.pg_notify($1, '') FROM j",
                 "UPDATE parts_indexed SET state = 'running' WHERE id = (SELECT id FROM "
                 "parts_indexed WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) "
                 "RETURNING id",
                 "DELETE FROM parts_indexed WHERE id = $1"});
  out.push_back({"jobs table", enqueue_jobs,
                 "UPDATE jobs SET state = 'running', claims = claims + 1 WHERE id = (SELECT id "
                 "FROM jobs WHERE state = 'available' ORDER BY shard, priority, run_at, id "
                 "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id",
                 done_jobs});
  // Rung k (k = 0..4) keeps the first k parts.
  for (std::size_t k = 0; k <= parts.size(); ++k) {
    std::string claim = conditions;
    for (std::size_t p = k; p < parts.size(); ++p) {
      for (const auto& text : parts[p].text)
        claim = without(claim, text, parts[p].what);
    }
    out.push_back({k == 0 ? "claim shape" : std::string("+ ") + parts[k - 1].what, enqueue_jobs,
                   claim, done_jobs});
  }
  out.push_back({"+ columns", enqueue_jobs, verbatim, done_jobs});
  out.push_back({"again", enqueue_jobs, verbatim, done_jobs});
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Options {
  int rounds = 5;
  int samples = 200;
  baton::Millis gap{2};
};

void run(const std::string& url, const Options& o) {
  const std::string schema = "bench_cp_" + std::to_string(getpid());
  auto admin = baton::detail::connect({.url = url, .schema = schema, .session_settings = false});
  pqxx::nontransaction(*admin).exec("CREATE SCHEMA " + schema);
  struct Drop {
    pqxx::connection& c;
    std::string schema;
    ~Drop() {
      try {
        pqxx::nontransaction(c).exec("DROP SCHEMA " + schema + " CASCADE");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "claim_parts: could not drop schema %s: %s\n", schema.c_str(),
                     e.what());
      }
    }
  } drop{*admin, schema};
  baton::detail::migrate(*admin, schema);
  {
    pqxx::nontransaction tx(*admin);
    tx.exec("CREATE TABLE " + schema +
            ".parts_floor (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'queued', "
            "payload jsonb NOT NULL)");
    tx.exec("CREATE TABLE " + schema + ".parts_indexed (LIKE " + schema +
            ".parts_floor INCLUDING DEFAULTS, PRIMARY KEY (id))");
    tx.exec("CREATE INDEX ON " + schema + ".parts_indexed (id) WHERE state = 'queued'");
    tx.exec("CREATE INDEX ON " + schema + ".parts_indexed (id) WHERE state = 'running'");
    tx.exec("INSERT INTO " + schema +
            ".locks (lock_key, region, client_id, epoch, expires_at) VALUES ('bench-parts', "
            "'bench', 'bench-parts', 1, 'infinity')");
    tx.exec("VACUUM ANALYZE " + schema + ".jobs");
    tx.exec("VACUUM ANALYZE " + schema + ".parts_floor");
    tx.exec("VACUUM ANALYZE " + schema + ".parts_indexed");
  }
  const auto rungs = ladder();
  const std::string path = "SET search_path TO " + schema;
  // Each listener's session is set as the poller's claim session is.
  baton::worker::PollerConfig poller;
  poller.connect = {.url = url, .schema = schema};
  const std::string claim_settings = baton::detail::session_statement(
      *admin, baton::worker::with_claim_session(std::move(poller)).connect);
  Conn producer = open(url, path);
  std::vector<Conn> listeners;
  const Oid claim_types[10] = {25, 20, 25, 25, 1009, 23, 1009, 25, 1009, 23};
  const Oid id_type[1] = {20};
  const Oid channel_type[1] = {25};
  std::vector<std::string> channels;
  for (std::size_t i = 0; i < rungs.size(); ++i) {
    listeners.push_back(open(url, claim_settings));
    PGconn* l = listeners.back().get();
    channels.push_back(schema + "_parts_" + std::to_string(i));
    checked(l, PQexec(l, ("LISTEN " + channels.back()).c_str()), "listen");
    checked(l, PQprepare(l, "claim", rungs[i].claim.c_str(), 10, claim_types),
            rungs[i].name + ": prepare");
    checked(l, PQprepare(l, "done", rungs[i].done.c_str(), 1, id_type), "prepare done");
    checked(producer.get(),
            PQprepare(producer.get(), ("enqueue" + std::to_string(i)).c_str(),
                      rungs[i].enqueue.c_str(), 1, channel_type),
            "prepare enqueue");
  }
  const char* params[10] = {"bench-parts", "1",  "bench-parts",       "bench",   "{}",
                            "100",         "{}", "bench/bench-parts", "{parts}", "0"};
  // [rung][round] -> that round's p50, ms
  std::vector<std::vector<double>> p50(rungs.size());
  std::mt19937 rng(std::random_device{}());
  std::vector<std::size_t> order(rungs.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<std::vector<double>> ms(rungs.size());
    for (int s = 0; s < o.samples; ++s) {
      std::shuffle(order.begin(), order.end(), rng);
      for (const auto i : order) {
        PGconn* l = listeners[i].get();
        const char* channel[1] = {channels[i].c_str()};
        checked(producer.get(),
                PQexecPrepared(producer.get(), ("enqueue" + std::to_string(i)).c_str(), 1, channel,
                               nullptr, nullptr, 0),
                "enqueue");
        const auto answered = Clock::now();
        const auto deadline = answered + std::chrono::seconds(10);
        for (;;) {
          if (PQconsumeInput(l) == 0) throw std::runtime_error(PQerrorMessage(l));
          if (PGnotify* n = PQnotifies(l)) {
            PQfreemem(n);
            break;
          }
          if (Clock::now() > deadline) {
            throw std::runtime_error(rungs[i].name + ": no notification within 10 s");
          }
          pollfd fd{PQsocket(l), POLLIN, 0};
          (void)::poll(&fd, 1, 100);
        }
        const auto r = checked(l, PQexecPrepared(l, "claim", 10, params, nullptr, nullptr, 0),
                               rungs[i].name + ": claim");
        const auto claimed = Clock::now();
        if (PQntuples(r.get()) != 1) {
          throw std::runtime_error(rungs[i].name + ": claimed " +
                                   std::to_string(PQntuples(r.get())) + " jobs, not the one");
        }
        const char* id[1] = {PQgetvalue(r.get(), 0, 0)};
        checked(l, PQexecPrepared(l, "done", 1, id, nullptr, nullptr, 0), "done");
        ms[i].push_back(std::chrono::duration<double, std::milli>(claimed - answered).count());
        std::this_thread::sleep_for(o.gap);
      }
    }
    for (std::size_t i = 0; i < rungs.size(); ++i)
      p50[i].push_back(median(ms[i]));
  }
  std::printf("%-14s %28s %30s\n", "rung", "p50 ms (range)", "step over the rung below");
  for (std::size_t i = 0; i < rungs.size(); ++i) {
    const auto [lo, hi] = std::minmax_element(p50[i].begin(), p50[i].end());
    nlohmann::json j = {{"bench", "claim_parts"},  {"rung", rungs[i].name},
                        {"rounds", o.rounds},      {"samples", o.samples},
                        {"gap_ms", o.gap.count()}, {"p50_ms", median(p50[i])},
                        {"p50_min_ms", *lo},       {"p50_max_ms", *hi}};
    char step[64] = "";
    if (i > 0) {
      std::vector<double> d;
      for (int r = 0; r < o.rounds; ++r)
        d.push_back(p50[i][r] - p50[i - 1][r]);
      const auto [dlo, dhi] = std::minmax_element(d.begin(), d.end());
      std::snprintf(step, sizeof step, "%+.3f (%+.3f to %+.3f)", median(d), *dlo, *dhi);
      j["step_ms"] = median(d);
      j["step_min_ms"] = *dlo;
      j["step_max_ms"] = *dhi;
    }
    std::printf("%-14s %10.3f (%.3f-%.3f) %30s\n", rungs[i].name.c_str(), median(p50[i]), *lo, *hi,
                step);
    std::printf("%s\n", j.dump().c_str());
  }
  // Baton's claim is the last rung but the control.
  const auto& baton_claim = p50[rungs.size() - 2];
  std::vector<double> ratio;
  for (int r = 0; r < o.rounds; ++r)
    ratio.push_back(baton_claim[r] / p50.front()[r]);
  const auto [rlo, rhi] = std::minmax_element(ratio.begin(), ratio.end());
  std::printf("baton's claim / the floor: %.2f (%.2f-%.2f)\n", median(ratio), *rlo, *rhi);
  std::printf("%s\n", nlohmann::json({{"bench", "claim_parts_ratio"},
                                      {"ratio", median(ratio)},
                                      {"ratio_min", *rlo},
                                      {"ratio_max", *rhi}})
                          .dump()
                          .c_str());
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage = "bench/claim_parts [--rounds 5] [--samples 200] [--gap 2ms]";
  if (const int code = baton::bench::check_flag_pairs(argc, argv, kUsage); code >= 0) return code;
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    try {
      if (flag == "--rounds" || flag == "--samples") {
        std::size_t used = 0;
        const int n = std::stoi(value, &used);
        if (used != value.size() || n < 1 || n > 100000) throw std::invalid_argument(value);
        (flag == "--rounds" ? o.rounds : o.samples) = n;
      } else if (flag == "--gap") {
        try {
          o.gap = baton::parse_duration(value, "--gap");  // the nodes' own rule and message
        } catch (const std::exception& e) {
          std::fprintf(stderr, "claim_parts: %s\n", e.what());
          return 2;
        }
      } else {
        std::fprintf(stderr, "claim_parts: unknown flag %s\nusage: %s\n", flag.c_str(), kUsage);
        return 2;
      }
    } catch (const std::logic_error&) {  // std::stoi's invalid_argument and out_of_range
      std::fprintf(stderr, "claim_parts: %s takes a whole number from 1 to 100000, not '%s'\n",
                   flag.c_str(), value.c_str());
      return 2;
    }
  }
  try {
    baton::test::TempDirsGuard temp_dirs;
    baton::bench::BenchDatabase database;
    run(database.url(), o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "claim_parts: %s\n", e.what());
    return 1;
  }
  return 0;
}
