// batonctl drill: fault the leader (ask it to step down, or kill -9 it), then report when the
// next leader was granted and started its first job, on the database clock. With shards, the
// node faulted is shard 0's leader, and the report also says where each of its other shards went
// and when.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <baton/admin.h>
#include <baton/config.h>

#include "baton/detail/db.h"
#include "common.h"
#include "output.h"

namespace batonctl {
namespace {

struct DrillOptions {
  bool kill = false;
  std::string timeout = "30s";
  std::string lock_key = "baton-leader";
  std::string region = "default";
};

constexpr const char* kLeaderSql = R"sql(
SELECT l.client_id, l.epoch, n.pid, n.host, l.holder_pid, clock_timestamp()::text
  FROM locks l LEFT JOIN nodes n ON n.node_id = l.client_id
 WHERE l.lock_key = $1 AND l.region = $2 AND l.expires_at > clock_timestamp()
)sql";

// The election session's client address as the server sees it, when it may show it.
constexpr const char* kClientPortSql = R"sql(
SELECT host(client_addr), client_port FROM pg_catalog.pg_stat_activity
 WHERE pid = $1 AND client_port > 0
)sql";

constexpr const char* kGrantedSql = R"sql(
SELECT client_id, epoch, round(extract(epoch FROM created_date - $4::timestamptz) * 1000)::bigint
  FROM locks WHERE lock_key = $1 AND region = $2 AND epoch > $3
)sql";

// The first job the new leader started: a claim under the new epoch, still running or finished.
constexpr const char* kFirstJobSql = R"sql(
SELECT round(extract(epoch FROM least(
         (SELECT min(claimed_at) FROM jobs WHERE claim_group = $1 AND claimed_epoch = $2),
         (SELECT min(started_at) FROM job_history
           WHERE finished_at >= $4::timestamptz AND node = $3 AND epoch = $2))
         - $4::timestamptz) * 1000)::bigint
)sql";

// With shards: the lock rows the faulted node held, other than shard 0's ("<lock_key>:<k>").
constexpr const char* kOtherShardsSql = R"sql(
SELECT lock_key, epoch, substring(lock_key FROM ':([0-9]+)$')::int
  FROM locks
 WHERE region = $1 AND left(lock_key, length($2) + 1) = $2 || ':' AND client_id = $3
   AND expires_at > clock_timestamp() AND lock_key ~ ':[0-9]+$'
 ORDER BY 3
)sql";

// Their holders now, with the time since the fault of each grant.
constexpr const char* kShardHoldersSql = R"sql(
SELECT lock_key, client_id, epoch,
       round(extract(epoch FROM created_date - $3::timestamptz) * 1000)::bigint
  FROM locks
 WHERE region = $1 AND lock_key = ANY ($2::text[]) AND expires_at > clock_timestamp()
)sql";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// NUL-separated strings (/proc/<pid>/cmdline and environ) as a list.
std::vector<std::string> split_nul(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\0') {
      if (i > start) out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// The inode of the local TCP socket bound to address:port, from /proc/net/tcp{,6}; 0 if none.
unsigned long socket_inode(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(read_file(table));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout;
      unsigned long inode = 0;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      const auto colon = local.rfind(':');
      if (colon != std::string::npos && std::stoi(local.substr(colon + 1), nullptr, 16) == port &&
          inode != 0) {
        return inode;
      }
    }
  }
  return 0;
}

bool process_holds_socket(int pid, unsigned long inode) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  bool found = false;
  while (const dirent* e = readdir(d)) {  // NOLINT(concurrency-mt-unsafe): one thread
    std::array<char, 64> target{};
    const std::string link = dir + "/" + e->d_name;
    const auto n = readlink(link.c_str(), target.data(), target.size() - 1);
    if (n > 0 && want == std::string(target.data(), static_cast<std::size_t>(n))) found = true;
  }
  closedir(d);
  return found;
}

// Why `pid` must not be killed as node `node_id`'s process, or "" when it is that process: pid
// above 1 and not batonctl itself, a live process on this host, and proof that it is the node
// (it holds the node's election connection, or its command line or environment names the node,
// or the node id is the default "<host>:<pid>").
std::string refuse_kill(int pid, const std::string& node_id, const std::string& host,
                        int client_port) {
  if (pid <= 1) return "its recorded pid is " + std::to_string(pid);
  if (pid == getpid() || pid == getpgrp()) return "its recorded pid is batonctl's own";
  const auto cmdline = split_nul(read_file("/proc/" + std::to_string(pid) + "/cmdline"));
  if (cmdline.empty()) return "no process " + std::to_string(pid) + " runs on this host";
  if (client_port > 0) {
    const auto inode = socket_inode(client_port);
    if (inode != 0 && process_holds_socket(pid, inode)) return "";
  }
  if (node_id == host + ":" + std::to_string(pid)) return "";
  for (std::size_t i = 0; i < cmdline.size(); ++i) {
    if (cmdline[i] == "--node-id=" + node_id) return "";
    if (cmdline[i] == "--node-id" && i + 1 < cmdline.size() && cmdline[i + 1] == node_id) {
      return "";
    }
  }
  for (const auto& var : split_nul(read_file("/proc/" + std::to_string(pid) + "/environ"))) {
    if (var == "BATON_NODE_ID=" + node_id) return "";
  }
  std::string shown;
  for (const auto& a : cmdline)
    shown += (shown.empty() ? "" : " ") + a;
  return "process " + std::to_string(pid) + " ('" + shown.substr(0, 120) +
         "') does not show that it is node " + node_id;
}

int run_drill(const Global& g, const DrillOptions& o) {
  const auto timeout = baton::parse_duration(o.timeout, "timeout");
  auto conn = open(g);
  const std::string group = o.region + "/" + o.lock_key;
  auto query = [&](const char* sql, auto&&... args) {
    pqxx::nontransaction tx(*conn);
    return tx.exec_params(sql, args...);
  };
  const auto now_leading = query(kLeaderSql, o.lock_key, o.region);
  if (now_leading.empty()) throw Failure("no node leads now; start nodes first (batonctl nodes)");
  const std::string leader = now_leading[0][0].c_str();
  const auto epoch = now_leading[0][1].as<std::int64_t>();
  const std::string t0 = now_leading[0][5].c_str();
  // The other shards it leads, and where each goes.
  struct Moved {
    std::string key;
    std::int64_t epoch;
    int shard;
    std::optional<long long> ms{};
    std::string to{};
    std::int64_t new_epoch = 0;
  };
  std::vector<Moved> shards;
  for (const auto& r : query(kOtherShardsSql, o.region, o.lock_key, leader)) {
    shards.push_back({r[0].c_str(), r[1].as<std::int64_t>(), r[2].as<int>()});
  }
  std::ostringstream quiet;  // with --json, the timeline is not printed
  std::ostream& out = g.json ? quiet : std::cout;
  const bool tty = isatty(1) != 0 && !g.json;
  if (o.kill) {
    if (now_leading[0][2].is_null()) throw Failure(leader + " has no row in nodes; cannot kill it");
    const int pid = now_leading[0][2].as<int>();
    std::array<char, 256> host{};
    gethostname(host.data(), host.size() - 1);
    if (std::string(now_leading[0][3].c_str()) != host.data()) {
      throw Failure(leader +
                    " runs on another host; --kill works on this host only (run the "
                    "drill without --kill to ask it to step down)");
    }
    int client_port = 0;
    if (!now_leading[0][4].is_null()) {
      const auto port = query(kClientPortSql, now_leading[0][4].as<int>());
      if (!port.empty()) client_port = port[0][1].as<int>();
    }
    const auto why = refuse_kill(pid, leader, host.data(), client_port);
    if (!why.empty()) {
      throw Failure("refusing to kill " + leader + ": " + why +
                    "; kill it yourself, or run the drill without --kill");
    }
    ::kill(pid, SIGKILL);
    out << "+0 ms      killed " << leader << " (epoch " << epoch << ", pid " << pid << ")\n";
  } else {
    baton::Admin(*conn, g.schema, actor()).request_step_down(leader, "batonctl drill");
    out << "+0 ms      asked " << leader << " (epoch " << epoch << ") to step down\n";
  }
  // The probe goes to shard 0 (a plain INSERT takes the column's default), whose leader the drill
  // times; it wakes that leader however the queue's wake keys stand.
  auto send_probe = [&]() {
    pqxx::work tx(*conn);
    const auto id = tx.exec1(
                          "INSERT INTO jobs (queue, type, payload) "
                          "VALUES ('default', 'baton.drill', '{}') RETURNING id")[0]
                        .as<std::int64_t>();
    tx.exec_params("SELECT pg_notify($1, 'default')", baton::detail::jobs_channel(g.schema));
    tx.commit();
    return id;
  };
  auto probe = send_probe();
  const auto sent = std::chrono::steady_clock::now();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto line = [&out](long long ms, const std::string& what) {
    std::string head = "+" + std::to_string(ms) + " ms";
    head.resize(std::max<std::size_t>(head.size() + 1, 11), ' ');
    out << head << what << "\n";
  };
  std::optional<long long> granted, started;
  std::string next;
  std::int64_t next_epoch = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!granted) {
      const auto r = query(kGrantedSql, o.lock_key, o.region, epoch, t0);
      if (!r.empty()) {
        next = r[0][0].c_str();
        next_epoch = r[0][1].as<std::int64_t>();
        granted = r[0][2].as<long long>();
        if (tty) std::cout << "\r";
        line(*granted, "leader " + next + " granted epoch " + std::to_string(next_epoch));
      }
    }
    bool all_moved = true;
    if (!shards.empty()) {
      std::vector<std::string> keys;
      keys.reserve(shards.size());
      for (const auto& m : shards)
        keys.push_back(m.key);
      for (const auto& r : query(kShardHoldersSql, o.region, baton::detail::text_array(keys), t0)) {
        for (auto& m : shards) {
          if (m.key == r[0].c_str() && !m.ms && r[2].as<std::int64_t>() > m.epoch) {
            m.to = r[1].c_str();
            m.new_epoch = r[2].as<std::int64_t>();
            m.ms = r[3].as<long long>();
            if (tty) std::cout << "\r";
            line(*m.ms, "shard " + std::to_string(m.shard) + " to " + m.to + " (epoch " +
                            std::to_string(m.new_epoch) + ")");
          }
        }
      }
      for (const auto& m : shards)
        all_moved = all_moved && m.ms.has_value();
    }
    if (granted && !started) {
      const auto r = query(kFirstJobSql, group, next_epoch, next, t0);
      if (!r[0][0].is_null()) {
        started = r[0][0].as<long long>();
      } else if (const auto ran = query("SELECT epoch FROM job_history WHERE id = $1", probe);
                 !ran.empty() && ran[0][0].as<std::int64_t>(0) != next_epoch) {
        // The leader asked to step down ran the probe before it stopped claiming: send another
        // for the new leader to start (the time to its start includes this poll's delay).
        probe = send_probe();
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - sent)
                            .count();
        if (tty) std::cout << "\r";
        line(ms, "the old leader ran the probe; sent another");
      }
    }
    if (started && all_moved) break;
    if (tty) {
      std::cout << "\rwaiting for " << (granted ? "its first job" : "a new leader") << "..."
                << std::flush;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (tty) std::cout << "\r";
  if (!started) {
    out << (granted ? "no job started" : "no new leader") << " within " << timeout.count()
        << " ms\n";
    return 1;
  }
  line(*started, "first job started under the new leader");
  out << "failover took " << *started << " ms (fault to first job)\n";
  long long last_move = *granted;
  nlohmann::json moves = nlohmann::json::array();
  for (const auto& m : shards) {
    if (!m.ms) {
      out << "shard " << m.shard << " did not move within " << timeout.count() << " ms\n";
      return 1;
    }
    last_move = std::max(last_move, *m.ms);
    moves.push_back({{"shard", m.shard}, {"to", m.to}, {"epoch", m.new_epoch}, {"ms", *m.ms}});
  }
  if (!shards.empty()) {
    out << "all " << shards.size() + 1 << " shards of " << leader << " led elsewhere after "
        << last_move << " ms\n";
  }
  if (g.json) {
    print_result(true, "",
                 {{"leader", leader},
                  {"killed", o.kill},
                  {"next_leader", next},
                  {"granted_ms", *granted},
                  {"first_job_ms", *started},
                  {"other_shards", moves},
                  {"all_shards_moved_ms", last_move}});
  }
  return 0;
}

}  // namespace

void add_drill(CLI::App& app, const Global& g, Command& chosen) {
  auto o = std::make_shared<DrillOptions>();
  auto* cmd = app.add_subcommand(
      "drill", "failover drill: ask the leader to step down (or --kill it) and time the takeover");
  cmd->add_flag("--kill", o->kill,
                "kill -9 the leader (it must run on this host, and be shown to be that node)");
  cmd->add_option("--timeout", o->timeout, "give up after this long")->capture_default_str();
  cmd->add_option("--lock-key", o->lock_key, "the lock group's key")->capture_default_str();
  cmd->add_option("--region", o->region, "the lock group's region")->capture_default_str();
  cmd->callback([&g, &chosen, o] { chosen = [&g, o] { return run_drill(g, *o); }; });
}

}  // namespace batonctl
