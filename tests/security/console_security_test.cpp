// Attacks on the console's port: a web page that rebinds its name to 127.0.0.1, cross-site
// requests that try to act with the operator's browser, clients without the token or with a
// wrong one, a console whose database role may not act, and settings that would expose it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/roles.h"

namespace {

using namespace baton::test;

std::string csrf_of(const std::string& address,
                    const std::vector<std::pair<std::string, std::string>>& auth = {}) {
  const auto r = http_request(address, "GET", "/api/session", auth);
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_object() ? j.value("csrf", "") : "";
}

long long paused(Cluster& cluster, const std::string& queue) {
  return cluster.count("SELECT count(*) FROM queue_state WHERE paused AND queue = '" + queue + "'");
}

TEST(HostileConsole, WithoutATokenOnlyLoopbackNamesAreAnsweredAndActionsNeedThePagesToken) {
  Cluster cluster(unique_schema("console_csrf"), 1, {"--console-listen", "127.0.0.1:0"});
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto address = cluster.console_addr("n1");
  ASSERT_NE(address, "") << cluster.logs();
  const auto port = address.substr(address.rfind(':'));

  // DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 reaches the
  // port with its own name in Host. Nothing is served to it, not even the page.
  // A name that only looks like a loopback address is anyone's name.
  for (const std::string host : {"evil.example", "127.evil.example", "127.0.0.1.nip.io",
                                 "localhost.evil.example", "[::1].evil.example", ""}) {
    for (const std::string path : {"/", "/api/session", "/api/cluster"}) {
      const auto r = http_request(address, "GET", path, {{"Host", host + port}});
      EXPECT_EQ(r.status, 403) << host << path << ": " << r.body;
      EXPECT_EQ(r.body.find("csrf"), std::string::npos);
    }
  }
  for (const std::string host : {"localhost", "127.0.0.1", "127.0.0.2", "[::1]"}) {
    EXPECT_EQ(http_request(address, "GET", "/", {{"Host", host + port}}).status, 200) << host;
  }
  EXPECT_EQ(http_request(address, "GET", "/api/cluster").status, 200);

  const auto csrf = csrf_of(address);
  ASSERT_EQ(csrf.size(), 64U);
  const std::string pause = R"({"action":"pause","queue":"victim"})";
  const std::vector<std::vector<std::pair<std::string, std::string>>> forged{
      // a cross-site form: no custom header possible, a form content type
      {{"Content-Type", "application/x-www-form-urlencoded"}},
      {{"Content-Type", "text/plain"}, {"X-Baton-Csrf", csrf}},
      // fetch() from another site without the page's token
      {{"Content-Type", "application/json"}},
      {{"Content-Type", "application/json"},
       {"X-Baton-Csrf", std::string(csrf[0] == '0' ? "1" : "0").append(csrf.substr(1))}},
      // the token, but the browser says the request comes from elsewhere
      {{"Content-Type", "application/json"},
       {"X-Baton-Csrf", csrf},
       {"Origin", "http://evil.example"}},
      {{"Content-Type", "application/json"},
       {"X-Baton-Csrf", csrf},
       {"Sec-Fetch-Site", "cross-site"}},
      {{"Content-Type", "application/json"},
       {"X-Baton-Csrf", csrf},
       {"Sec-Fetch-Site", "same-site"}},
      {{"Content-Type", "application/json"}, {"X-Baton-Csrf", csrf}, {"Origin", "null"}},
  };
  for (const auto& headers : forged) {
    const auto r = http_request(address, "POST", "/api/action", headers, pause);
    std::string sent;
    for (const auto& [name, value] : headers)
      sent += name + ": " + value + "; ";
    EXPECT_EQ(r.status, 403) << sent << "-> " << r.body;
  }
  EXPECT_EQ(http_request(address, "GET", "/api/action?action=pause&queue=victim").status, 405);
  EXPECT_EQ(paused(cluster, "victim"), 0) << "a forged request paused the queue";

  const auto ok = http_request(address, "POST", "/api/action",
                               {{"Content-Type", "application/json"},
                                {"X-Baton-Csrf", csrf},
                                {"Origin", "http://" + address},
                                {"Sec-Fetch-Site", "same-origin"}},
                               pause);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(paused(cluster, "victim"), 1);
  EXPECT_NE(cluster.process("n1").log().find("console: console@127.0.0.1"), std::string::npos)
      << "the action is logged with who asked";

  // Every answer forbids framing and foreign scripts.
  const auto page = http_request(address, "GET", "/");
  EXPECT_NE(page.headers.find("Content-Security-Policy: default-src 'none'; script-src 'self'"),
            std::string::npos)
      << page.headers;
  EXPECT_NE(page.headers.find("X-Frame-Options: DENY"), std::string::npos);

  // Bad input gets a clear refusal and changes nothing.
  for (const std::string body :
       {"not json", R"({"action":"pause","queue":"bad name; DROP TABLE jobs"})",
        R"({"action":"retry","ids":["1 OR 1=1"]})", R"({"action":"explode"})",
        R"({"action":"pause","queue":7})",
        R"({"action":"step_down","node":"x\n[info] leadership GRANTED: epoch=99"})"}) {
    const auto r =
        http_request(address, "POST", "/api/action",
                     {{"Content-Type", "application/json"}, {"X-Baton-Csrf", csrf}}, body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
  }
  EXPECT_EQ(http_request(address, "GET", "/api/jobs?state=%27%3B+DROP").status, 400);
  EXPECT_EQ(http_request(address, "GET", "/api/job?id=1+OR+1%3D1").status, 400);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM pg_tables WHERE tablename = 'jobs' AND "
                          "schemaname = current_schema()"),
            1);
  EXPECT_EQ(cluster.process("n1").log().find("\n[info] leadership GRANTED: epoch=99"),
            std::string::npos)
      << "a request must not write lines of its own into the log";

  // What a hostile producer can put in the queue does not break the pages: a job due in 1980,
  // ids beyond 32 bits.
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("INSERT INTO queue_state (queue, paused, updated_by) VALUES ('old', true, 't')");
    tx.exec("INSERT INTO jobs (queue, type, run_at) VALUES ('old', 'noop', '1980-01-01')");
  }
  const auto queues = http_request(address, "GET", "/api/queues");
  EXPECT_EQ(queues.status, 200) << queues.body;
  EXPECT_NE(queues.body.find("\"queue\":\"old\""), std::string::npos) << queues.body;
  const auto big = http_request(address, "GET", "/api/jobs?id=3000000000");
  EXPECT_EQ(big.status, 200) << big.body;
}

TEST(HostileConsole, ATokenIsRequiredWhenGivenAndNamesWhoActed) {
  const auto schema = unique_schema("console_token");
  const auto dir = std::filesystem::temp_directory_path() / schema;
  std::filesystem::create_directories(dir);
  const std::string token = "s3cret-console-token-0123456789";
  std::ofstream(dir / "token") << token << "\n";
  Cluster cluster(
      schema, 1,
      {"--console-listen", "127.0.0.1:0", "--console-token-file", (dir / "token").string()});
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto address = cluster.console_addr("n1");
  ASSERT_NE(address, "") << cluster.logs();

  const auto none = http_request(address, "GET", "/api/session");
  EXPECT_EQ(none.status, 401);
  EXPECT_NE(none.headers.find("WWW-Authenticate: Basic"), std::string::npos) << none.headers;
  EXPECT_EQ(http_request(address, "GET", "/").status, 401) << "not even the page";
  for (const std::string& wrong : std::vector<std::string>{
           "Bearer " + token.substr(0, token.size() - 1), "Bearer " + token + "x", "Bearer ",
           "Basic b3BzOndyb25n", "Basic !!!", token}) {
    EXPECT_EQ(http_request(address, "GET", "/api/cluster", {{"Authorization", wrong}}).status, 401)
        << wrong;
  }
  EXPECT_EQ(
      http_request(address, "GET", "/api/cluster", {{"Authorization", "Bearer " + token}}).status,
      200);
  // Basic auth as a browser sends it: any user name, the token as password.
  // "alice:s3cret-console-token-0123456789"
  const std::vector<std::pair<std::string, std::string>> alice{
      {"Authorization", "Basic YWxpY2U6czNjcmV0LWNvbnNvbGUtdG9rZW4tMDEyMzQ1Njc4OQ=="}};
  const auto csrf = csrf_of(address, alice);
  ASSERT_EQ(csrf.size(), 64U);
  auto headers = alice;
  headers.emplace_back("Content-Type", "application/json");
  headers.emplace_back("X-Baton-Csrf", csrf);
  const auto r =
      http_request(address, "POST", "/api/action", headers, R"({"action":"pause","queue":"q1"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(query_value(cluster.db(), "SELECT updated_by FROM queue_state WHERE queue = 'q1'"),
            "console:alice");
  EXPECT_EQ(cluster.process("n1").log().find(token), std::string::npos)
      << "the token never appears in the log";
  std::filesystem::remove_all(dir);
}

TEST(HostileConsole, AConsoleWhoseRoleMayNotActSaysWhichRoleToGive) {
  const auto schema = unique_schema("console_role");
  const auto node_role = role_name(schema, "node");
  Cluster cluster(schema, 0, {"--console-listen", "127.0.0.1:0"}, url_as(node_role));
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec("CREATE ROLE " + node_role + " LOGIN");
    tx.exec(documented_block("security.md", "grants", "baton_node", schema, node_role));
  }
  cluster.start("n1");
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  const auto address = cluster.console_addr("n1");
  ASSERT_NE(address, "") << cluster.logs();
  EXPECT_EQ(http_request(address, "GET", "/api/cluster").status, 200)
      << "the node role reads everything the console shows";
  EXPECT_EQ(http_request(address, "GET", "/api/queues").status, 200);
  const auto r =
      http_request(address, "POST", "/api/action",
                   {{"Content-Type", "application/json"}, {"X-Baton-Csrf", csrf_of(address)}},
                   R"({"action":"pause","queue":"q1"})");
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("--console-database-url"), std::string::npos) << r.body;
  // Retrying a dead letter enqueues, which the node role may not do from here either; it says
  // so and the dead letter stays.
  {
    pqxx::nontransaction tx(cluster.db());
    tx.exec(
        "INSERT INTO dead_jobs (id, queue, type, payload, priority, attempts, max_attempts, "
        "created_at, reason) VALUES (424242, 'q1', 'noop', '{}', 0, 1, 1, now(), 'test')");
  }
  const auto retry =
      http_request(address, "POST", "/api/action",
                   {{"Content-Type", "application/json"}, {"X-Baton-Csrf", csrf_of(address)}},
                   R"({"action":"retry","ids":[424242]})");
  EXPECT_EQ(retry.status, 403) << retry.body;
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs WHERE id = 424242"), 1);
}

TEST(HostileConsole, SettingsThatWouldExposeTheConsoleAreRefusedAtStart) {
  const auto dir = std::filesystem::temp_directory_path() / unique_schema("console_cfg");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "short") << "abc\n";
  const std::string batond = std::string(BATON_BIN_DIR) + "/batond";
  struct Case {
    std::string flags;
    std::string says;
  };
  for (const auto& c :
       {Case{"--console-listen 0.0.0.0:0", "--console-token-file"},
        Case{"--console-listen 192.0.2.1:8080", "beyond loopback"},
        Case{"--console-listen nowhere", "is not host:port"},
        Case{"--console-listen 127.0.0.1:0 --console-token-file " + (dir / "short").string(),
             "shorter than 16 characters"},
        Case{"--console-listen 127.0.0.1:0 --console-token-file " + (dir / "missing").string(),
             "cannot read"}}) {
    std::string out;
    const int rc =
        run_command(batond + " --database-url '" + database_url() + "' --schema " +
                        unique_schema("cfg") + " --metrics-listen off " + c.flags + " 2>&1",
                    &out);
    EXPECT_NE(rc, 0) << c.flags;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.flags << ": " << out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
