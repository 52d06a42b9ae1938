// A cluster of real node processes (demo_node: batond's settings with the examples' handlers) on
// one schema, and what tests ask of it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/support.h"

namespace baton::test {

class Cluster {
 public:
  // Migrates `schema` and starts `nodes` demo_node processes named n1..nN. `extra` flags
  // go to every node; `url` (default: the test database as its superuser) is the nodes'.
  // `admin_url` (default: the test database) is the one the test migrates and queries with.
  Cluster(const std::string& schema, int nodes, std::vector<std::string> extra = {},
          std::string url = "", std::string admin_url = "");

  Process& process(const std::string& node_id);
  std::vector<std::string> node_ids() const;
  // Starts one more node (or restarts a dead one) with the same flags, and `more` of its own
  // (which replace the defaults of the same name);
  // `program` instead of demo_node (batond, say).
  void start(const std::string& node_id, const std::vector<std::string>& more = {},
             const std::string& program = "demo_node");

  // The node holding a valid lease in the lock row, "" when none.
  std::string leader();
  long long epoch();
  // host:port of the node's /metrics, from the nodes table.
  std::string metrics_addr(const std::string& node_id);
  // host:port of the node's console (--console-listen), from its log line; "" when it does not
  // serve one within `timeout`.
  std::string console_addr(const std::string& node_id, std::chrono::milliseconds timeout = 20s);
  // How long a lease must have been held before wait_leader names its node.
  enum class Held {
    // Granted: for a test that times a hand-over from its fault to the next grant.
    granted,
    // Renewed for kSettled since its grant. Under the load of a suite's first minute, a new
    // leader can lose a slow first renewal (its lease is 395 ms by default) and hand over; a
    // test that names the leader and then acts on it (kills it, asks it to step down, waits for
    // its jobs) must not name that one.
    renewed,
  };
  static constexpr std::chrono::milliseconds kSettled{300};
  // Waits for a leader (other than `not_this`) whose lease has been held as `held` asks, and
  // returns it; "" on timeout. For clusters without shards: it reads the newest lock row, and
  // with shards each shard has its own.
  std::string wait_leader(std::chrono::milliseconds timeout, const std::string& not_this = "",
                          Held held = Held::renewed);

  pqxx::connection& db() { return *db_; }
  // Opens the test's own connection again (after a server restart).
  void reconnect() { db_ = connect(schema_, admin_url_); }
  long long count(const std::string& sql) { return query_int(*db_, sql); }
  // Every node's log, for failure messages.
  std::string logs() const;
  const std::string& dir() const { return dir_; }
  const std::string& schema() const { return schema_; }

 private:
  // The newest valid lease's node ("" when none), and whether it has been renewed for kSettled
  // since its grant.
  std::pair<std::string, bool> newest_lease();

  std::string schema_;
  std::string url_;
  std::string admin_url_;
  std::string dir_;
  std::vector<std::string> extra_;
  std::vector<std::pair<std::string, std::unique_ptr<Process>>> nodes_;
  std::unique_ptr<pqxx::connection> db_;
};

// Runs batonctl on `cluster`'s schema as the test database's superuser; its output, and its exit
// code in `rc`. Without `rc`, a non-zero exit code is a test failure.
std::string ctl(const Cluster& cluster, const std::string& args, int* rc = nullptr);

// Inserts `n` jobs of `type` with `payload` (JSON) into the default queue, straight into the
// table; with a `key_prefix`, job i gets the idempotency key prefix + i.
void enqueue(Cluster& cluster, const std::string& type, const std::string& payload, int n,
             const std::string& key_prefix = "");

// The table demo_node's transactional handlers write one row per committed effect to. It has no
// unique key, so an effect committed twice shows as two rows.
void create_effects(Cluster& cluster);

}  // namespace baton::test
