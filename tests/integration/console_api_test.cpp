// The console's endpoints on an in-process node, so that the sanitizer builds (which run the
// integration tests) see its server, caches and connection pool under concurrent clients.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/node_runner.h"
#include "support/schema_test.h"

namespace {

using namespace baton;
using namespace baton::test;

class ConsoleApi : public SchemaTest {};

// The value of one exact series (name with its labels) in a scrape, or -1 when absent.
double sample(const std::string& page, const std::string& name_and_labels) {
  const auto at = page.find("\n" + name_and_labels + " ");
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + name_and_labels.size() + 2));
}

nlohmann::json get_json(const std::string& address, const std::string& path) {
  const auto r = http_request(address, "GET", path);
  EXPECT_EQ(r.status, 200) << path << ": " << r.body;
  return nlohmann::json::parse(r.body, nullptr, false);
}

TEST_F(ConsoleApi, EveryEndpointAnswersConcurrentClientsAndActionsShowAtOnce) {
  auto config = test_config(schema_, "c1");
  config.console_listen = "127.0.0.1:0";
  config.metrics_listen = "127.0.0.1:0";
  RunningNode n(config, [](Node& node) {
    node.handle("noop", [](JobContext&) {});
    node.handle("fail", [](JobContext&) { throw std::runtime_error("no <b>luck</b>"); });
  });
  ASSERT_TRUE(wait_for([&] { return !n.node().console_address().empty(); }, 10s)) << n.error();
  ASSERT_TRUE(wait_for([&] { return n.node().is_leader(); }, 10s));
  const auto address = n.node().console_address();
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'a', 'noop' FROM generate_series(1, 20)");
    tx.exec("INSERT INTO jobs (queue, type, max_attempts) VALUES ('b', 'fail', 2)");
  }
  ASSERT_TRUE(wait_count("SELECT count(*) FROM dead_jobs", 1));
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 20));
  const auto dead_id = count("SELECT id FROM dead_jobs");

  // Eight clients at once on every endpoint while another pauses and resumes a queue.
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      const std::vector<std::string> paths{
          "/api/cluster",
          "/api/queues",
          "/api/series",
          "/api/schedules",
          "/api/jobs?queue=a",
          "/api/job?id=" + std::to_string(dead_id),
          "/api/dead",
          "/api/sagas",
          "/",
          "/app.js",
          "/api/jobs?state=completed&type=noop&id=" + std::to_string(c + 1)};
      for (int round = 0; round < 5; ++round) {
        for (const auto& p : paths) {
          if (http_request(address, "GET", p).status != 200) ++failures;
        }
      }
    });
  }
  const auto csrf = get_json(address, "/api/session").value("csrf", "");
  for (int i = 0; i < 6; ++i) {
    const auto r = http_request(
        address, "POST", "/api/action",
        {{"Content-Type", "application/json"}, {"X-Baton-Csrf", csrf}},
        nlohmann::json{{"action", i % 2 == 0 ? "pause" : "resume"}, {"queue", "a"}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    // What the action changed shows on the next read, whatever the cache held.
    const auto queues = get_json(address, "/api/queues");
    bool paused = false;
    for (const auto& q : queues) {
      if (q.value("queue", "") == "a") paused = q.value("paused", false);
    }
    EXPECT_EQ(paused, i % 2 == 0) << queues.dump();
  }
  for (auto& t : clients)
    t.join();
  EXPECT_EQ(failures.load(), 0);

  const auto story = get_json(address, "/api/job?id=" + std::to_string(dead_id));
  ASSERT_TRUE(story.contains("story")) << story.dump();
  std::string events;
  for (const auto& s : story["story"])
    events += s.value("event", "") + ";";
  EXPECT_EQ(events, "enqueued;attempt 1 failed;attempt 2 failed;dead (exhausted);") << events;

  const auto series = get_json(address, "/api/series");
  long long completed = 0;
  for (const auto& point : series["a"])
    completed += point.value("completed", 0LL);
  EXPECT_EQ(completed, 20) << series.dump();

  const auto jobs = get_json(address, "/api/jobs?queue=a&state=completed");
  EXPECT_EQ(jobs["jobs"].size(), 20U);
  EXPECT_EQ(http_request(address, "GET", "/api/job?id=999999999").status, 404);
  EXPECT_EQ(http_request(address, "POST", "/api/action", {{"Content-Type", "application/json"}},
                         R"({"action":"pause","queue":"a"})")
                .status,
            403);

  // Every answer is counted by kind and status.
  const auto page = scrape(n.node().metrics_address());
  EXPECT_EQ(sample(page, "baton_console_requests_total{code=\"200\",kind=\"action\"}"), 6) << page;
  EXPECT_EQ(sample(page, "baton_console_requests_total{code=\"403\",kind=\"action\"}"), 1);
  EXPECT_EQ(sample(page, "baton_console_requests_total{code=\"404\",kind=\"read\"}"), 1);
  EXPECT_GE(sample(page, "baton_console_requests_total{code=\"200\",kind=\"page\"}"), 16);
  EXPECT_GE(sample(page, "baton_console_requests_total{code=\"200\",kind=\"read\"}"), 300);
}

}  // namespace
