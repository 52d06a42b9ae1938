// A real Prometheus server (the Debian package, loopback only, data in a temporary directory)
// scrapes a real three-node cluster: every target is up and sum(baton_leader) is 1.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "support/cluster.h"

namespace {

using namespace baton::test;

// A PromQL query's answer (status and data), or a discarded value when Prometheus gave none.
nlohmann::json answer(const std::string& prometheus, const std::string& promql) {
  std::string encoded;
  for (char c : promql) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_') {
      encoded += c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      encoded += buf;
    }
  }
  return nlohmann::json::parse(http_get(prometheus, "/api/v1/query?query=" + encoded), nullptr,
                               false);
}

// The value of a scalar-vector PromQL query, or "" while Prometheus has no answer yet.
std::string query(const std::string& prometheus, const std::string& promql) {
  const auto j = answer(prometheus, promql);
  if (j.is_discarded() || j.value("status", "") != "success") return "";
  const auto& result = j["data"]["result"];
  if (!result.is_array() || result.size() != 1) return "";
  return result[0]["value"][1].get<std::string>();
}

// Writes a scrape config for `targets` (every second) and starts Prometheus on a free loopback
// port; returns its address.
std::string start_prometheus(const std::string& dir, const std::vector<std::string>& targets,
                             std::unique_ptr<Process>& prometheus) {
  {
    std::ofstream config(dir + "/prometheus.yml");
    config << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: baton\n"
              "    static_configs:\n      - targets: [";
    for (std::size_t i = 0; i < targets.size(); ++i) {
      config << (i > 0 ? ", " : "") << "'" << targets[i] << "'";
    }
    config << "]\n";
  }
  const std::string web = "127.0.0.1:" + std::to_string(free_port());
  prometheus = std::make_unique<Process>(
      std::vector<std::string>{"/usr/bin/prometheus", "--config.file=" + dir + "/prometheus.yml",
                               "--storage.tsdb.path=" + dir + "/tsdb",
                               "--web.listen-address=" + web},
      dir + "/prometheus.log");
  return web;
}

// The metrics addresses of every node, once each serves them.
std::vector<std::string> targets_of(Cluster& cluster) {
  std::vector<std::string> targets;
  wait_for(
      [&] {
        targets.clear();
        for (const auto& id : cluster.node_ids()) {
          const auto addr = cluster.metrics_addr(id);
          if (addr.empty()) return false;
          targets.push_back(addr);
        }
        return true;
      },
      20s);
  return targets;
}

TEST(Prometheus, ARealServerScrapesTheClusterAndSeesOneLeader) {
  Cluster cluster(unique_schema("prometheus"), 3);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto targets = targets_of(cluster);
  ASSERT_EQ(targets.size(), 3u) << cluster.logs();
  std::unique_ptr<Process> prometheus;
  const auto web = start_prometheus(cluster.dir(), targets, prometheus);
  ASSERT_TRUE(wait_for([&] { return query(web, "count(up{job=\"baton\"} == 1)") == "3"; }, 60s))
      << "Prometheus did not scrape all three nodes\n"
      << prometheus->log();
  ASSERT_TRUE(wait_for([&] { return query(web, "sum(baton_leader)") == "1"; }, 30s))
      << prometheus->log();
  EXPECT_EQ(query(web, "count(baton_node_info)"), "3");
}

// Every "expr" of the Grafana dashboard, with its variables set as "All" would.
std::vector<std::string> dashboard_queries() {
  std::ifstream in(std::string(BATON_SOURCE_DIR) + "/deploy/grafana/baton-dashboard.json");
  const auto dashboard = nlohmann::json::parse(in);
  std::vector<std::string> out;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
    if (j.is_object()) {
      for (const auto& [key, value] : j.items()) {
        if (key == "expr" && value.is_string()) {
          out.push_back(value.get<std::string>());
        } else {
          walk(value);
        }
      }
    } else if (j.is_array()) {
      for (const auto& v : j)
        walk(v);
    }
  };
  walk(dashboard);
  for (auto& q : out) {
    for (const char* var : {"$job", "$deployment", "$instance", "$queue"}) {
      for (auto at = q.find(var); at != std::string::npos; at = q.find(var))
        q.replace(at, std::string(var).size(), ".*");
    }
  }
  return out;
}

TEST(Prometheus, EveryDashboardQueryRunsAndTheShardPanelsShowOneLeaderPerShard) {
  Cluster cluster(unique_schema("prometheus_shards"), 0);
  for (const char* id : {"n1", "n2"})
    cluster.start(id, {"--shards", "4"});
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM locks WHERE expires_at > clock_timestamp()") ==
               4;
      },
      20s))
      << cluster.logs();
  const auto targets = targets_of(cluster);
  ASSERT_EQ(targets.size(), 2u) << cluster.logs();
  std::unique_ptr<Process> prometheus;
  const auto web = start_prometheus(cluster.dir(), targets, prometheus);
  ASSERT_TRUE(wait_for([&] { return query(web, "count(up{job=\"baton\"} == 1)") == "2"; }, 60s))
      << prometheus->log();
  const auto queries = dashboard_queries();
  ASSERT_GT(queries.size(), 20u);
  std::string ownership, led;
  for (const auto& q : queries) {
    const auto j = answer(web, q);
    EXPECT_FALSE(j.is_discarded()) << q;
    if (j.is_discarded()) continue;
    EXPECT_EQ(j.value("status", ""), "success") << q << "\n" << j.dump();
    if (q.find("baton_leader{") != std::string::npos && q.find("shard!=") != std::string::npos) {
      ownership = q;
    }
    if (q.find("baton_shards_led") != std::string::npos) led = q;
  }
  ASSERT_NE(ownership, "") << "no shard ownership panel";
  ASSERT_NE(led, "") << "no shards-led panel";
  // Shard ownership: one series per shard, each naming one node.
  ASSERT_TRUE(wait_for(
      [&] {
        const auto j = answer(web, ownership);
        if (j.is_discarded() || !j["data"]["result"].is_array()) return false;
        std::set<std::string> shards;
        for (const auto& series : j["data"]["result"]) {
          if (!shards.insert(series["metric"].value("shard", "")).second) return false;
        }
        return shards == std::set<std::string>{"0", "1", "2", "3"};
      },
      30s))
      << answer(web, ownership).dump() << "\n"
      << prometheus->log();
  ASSERT_TRUE(wait_for([&] { return query(web, "sum(" + led + ")") == "4"; }, 30s))
      << answer(web, led).dump();
}

}  // namespace
