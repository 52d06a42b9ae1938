// Cluster of real batond processes (see cluster.h).
#include "support/cluster.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"

namespace baton::test {

Cluster::Cluster(const std::string& schema, int nodes, std::vector<std::string> extra,
                 std::string url, std::string admin_url)
    : schema_(schema),
      url_(url.empty() ? database_url() : std::move(url)),
      admin_url_(admin_url.empty() ? database_url() : std::move(admin_url)),
      dir_(temp_dir(schema)),
      extra_(std::move(extra)) {
  auto conn = detail::connect({.url = admin_url_, .schema = schema});
  detail::migrate(*conn, schema);
  db_ = connect(schema, admin_url_);
  for (int i = 1; i <= nodes; ++i) {
    std::string id = "n";
    id += std::to_string(i);
    start(id);
  }
}

void Cluster::start(const std::string& node_id, const std::vector<std::string>& more,
                    const std::string& program) {
  // A flag in `extra` or `more` replaces the default of the same name.
  const std::vector<std::pair<std::string, std::string>> defaults{
      {"--database-url", url_},     {"--schema", schema_},
      {"--node-id", node_id},       {"--metrics-listen", "127.0.0.1:0"},
      {"--poll-interval", "100ms"}, {"--retry-base", "10ms"},
      {"--retry-cap", "100ms"},     {"--threads", "4"}};
  auto named = [](const std::vector<std::string>& flags, const std::string& flag) {
    return std::find(flags.begin(), flags.end(), flag) != flags.end();
  };
  std::vector<std::string> argv{binary(program)};
  for (const auto& [flag, value] : defaults) {
    if (named(extra_, flag) || named(more, flag)) continue;
    argv.push_back(flag);
    argv.push_back(value);
  }
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  argv.insert(argv.end(), more.begin(), more.end());
  auto p = std::make_unique<Process>(argv, dir_ + "/" + node_id + ".log");
  for (auto& [id, proc] : nodes_) {
    if (id == node_id) {
      proc = std::move(p);
      return;
    }
  }
  nodes_.emplace_back(node_id, std::move(p));
}

Process& Cluster::process(const std::string& node_id) {
  for (auto& [id, proc] : nodes_) {
    if (id == node_id) return *proc;
  }
  throw std::out_of_range("no node " + node_id);
}

std::vector<std::string> Cluster::node_ids() const {
  std::vector<std::string> ids;
  for (const auto& n : nodes_)
    ids.push_back(n.first);
  return ids;
}

std::pair<std::string, bool> Cluster::newest_lease() {
  // created_date is the grant's transaction time, renewed_at its last renewal's.
  pqxx::nontransaction tx(*db_);
  const auto r = tx.exec_params(
      "SELECT client_id, renewed_at >= created_date + $1::bigint * interval '1 millisecond' "
      "FROM locks WHERE expires_at > clock_timestamp() ORDER BY epoch DESC LIMIT 1",
      static_cast<long long>(kSettled.count()));
  if (r.empty()) return {"", false};
  return {r[0][0].c_str(), r[0][1].as<bool>()};
}

std::string Cluster::leader() {
  return newest_lease().first;
}

long long Cluster::epoch() {
  return query_int(*db_, "SELECT max(epoch) FROM locks");
}

std::string Cluster::metrics_addr(const std::string& node_id) {
  pqxx::nontransaction tx(*db_);
  auto r = tx.exec_params("SELECT metrics_addr FROM nodes WHERE node_id = $1", node_id);
  return r.empty() || r[0][0].is_null() ? "" : r[0][0].c_str();
}

std::string Cluster::console_addr(const std::string& node_id, std::chrono::milliseconds timeout) {
  const std::string mark = "serving the console on http://";
  std::string address;
  wait_for(
      [&] {
        const auto log = process(node_id).log();
        const auto at = log.find(mark);
        if (at == std::string::npos) return false;
        const auto start = at + mark.size();
        address = log.substr(start, log.find('/', start) - start);
        return true;
      },
      timeout);
  return address;
}

std::string Cluster::wait_leader(std::chrono::milliseconds timeout, const std::string& not_this,
                                 Held held) {
  std::string found;
  auto ready = [&] {
    const auto [node, renewed] = newest_lease();
    found = node;
    return !found.empty() && found != not_this && (held == Held::granted || renewed);
  };
  return wait_for(ready, timeout, 5ms) ? found : "";
}

std::string Cluster::logs() const {
  std::string all;
  for (const auto& [id, proc] : nodes_)
    all += "----- " + id + "\n" + proc->log();
  return all;
}

std::string ctl(const Cluster& cluster, const std::string& args, int* rc) {
  std::string out;
  const int code = run_command(binary("batonctl") + " --database-url '" + database_url() +
                                   "' --schema " + cluster.schema() + " " + args,
                               &out);
  if (rc != nullptr) {
    *rc = code;
  } else if (code != 0) {
    // A caller that does not look at the exit code relies on the command having worked: a step of
    // its setup that failed must not pass unseen (and fail later as something else).
    ADD_FAILURE() << "batonctl " << args << " exited " << code << ":\n" << out;
  }
  return out;
}

void enqueue(Cluster& cluster, const std::string& type, const std::string& payload, int n,
             const std::string& key_prefix) {
  pqxx::nontransaction tx(cluster.db());
  tx.exec_params(
      "INSERT INTO jobs (queue, type, payload, idempotency_key) SELECT 'default', $1, $2::jsonb, "
      "CASE WHEN $4 = '' THEN NULL ELSE $4 || g END FROM generate_series(1, $3) g",
      type, payload, n, key_prefix);
}

void create_effects(Cluster& cluster) {
  pqxx::nontransaction tx(cluster.db());
  tx.exec("CREATE TABLE effects (job_id bigint, node text, epoch bigint)");
}

}  // namespace baton::test
