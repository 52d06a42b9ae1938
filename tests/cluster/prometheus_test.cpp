// A real Prometheus server (the Debian package, loopback only, data in a temporary directory)
// scrapes a real three-node cluster: every target is up and sum(baton_leader) is 1.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/cluster.h"

namespace {

using namespace baton::test;

// The value of a scalar-vector PromQL query, or "" while Prometheus has no answer yet.
std::string query(const std::string& prometheus, const std::string& promql) {
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
  const auto body = http_get(prometheus, "/api/v1/query?query=" + encoded);
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return "";
  const auto& result = j["data"]["result"];
  if (!result.is_array() || result.size() != 1) return "";
  return result[0]["value"][1].get<std::string>();
}

TEST(Prometheus, ARealServerScrapesTheClusterAndSeesOneLeader) {
  Cluster cluster(unique_schema("prometheus"), 3);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  std::vector<std::string> targets;
  ASSERT_TRUE(wait_for(
      [&] {
        targets.clear();
        for (const auto& id : cluster.node_ids()) {
          const auto addr = cluster.metrics_addr(id);
          if (addr.empty()) return false;
          targets.push_back(addr);
        }
        return true;
      },
      20s));
  const std::string dir = cluster.dir();
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
  Process prometheus({"/usr/bin/prometheus", "--config.file=" + dir + "/prometheus.yml",
                      "--storage.tsdb.path=" + dir + "/tsdb", "--web.listen-address=" + web},
                     dir + "/prometheus.log");
  ASSERT_TRUE(wait_for([&] { return query(web, "count(up{job=\"baton\"} == 1)") == "3"; }, 60s))
      << "Prometheus did not scrape all three nodes\n"
      << prometheus.log();
  ASSERT_TRUE(wait_for([&] { return query(web, "sum(baton_leader)") == "1"; }, 30s))
      << prometheus.log();
  EXPECT_EQ(query(web, "count(baton_node_info)"), "3");
}

}  // namespace
