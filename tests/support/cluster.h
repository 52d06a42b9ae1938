// A cluster of real batond processes on one schema, and what tests ask of it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "support/support.h"

namespace baton::test {

class Cluster {
 public:
  // Migrates `schema` and starts `nodes` batond processes named <prefix>1..N. `extra` flags
  // go to every node.
  Cluster(const std::string& schema, int nodes, std::vector<std::string> extra = {});

  Process& process(const std::string& node_id);
  std::vector<std::string> node_ids() const;
  // Starts one more node (or restarts a dead one) with the same flags.
  void start(const std::string& node_id);

  // The node holding a valid lease in the lock row, "" when none.
  std::string leader();
  long long epoch();
  // host:port of the node's /metrics, from the nodes table.
  std::string metrics_addr(const std::string& node_id);
  // Waits for a leader (other than `not_this`) and returns it; "" on timeout.
  std::string wait_leader(std::chrono::milliseconds timeout, const std::string& not_this = "");

  pqxx::connection& db() { return *db_; }
  // Opens the test's own connection again (after a server restart).
  void reconnect() { db_ = connect(schema_); }
  long long count(const std::string& sql) { return query_int(*db_, sql); }
  // Every node's log, for failure messages.
  std::string logs() const;
  const std::string& dir() const { return dir_; }
  const std::string& schema() const { return schema_; }

 private:
  std::string schema_;
  std::string dir_;
  std::vector<std::string> extra_;
  std::vector<std::pair<std::string, std::unique_ptr<Process>>> nodes_;
  std::unique_ptr<pqxx::connection> db_;
};

}  // namespace baton::test
