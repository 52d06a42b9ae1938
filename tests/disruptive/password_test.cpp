// A wrong password: one clear message, retried with backoff, the node alive, and the password
// (right or wrong) nowhere in what it printed. Uses a throwaway server of its own that asks one
// role for a password (scram-sha-256).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "support/cluster.h"

namespace {

using namespace baton::test;

TEST(Password, AWrongPasswordIsReportedOnceAndRetriedWithoutLeakingIt) {
  const std::string dir = temp_dir("password");
  ThrowawayServer server(dir);
  const std::string url = server.url();
  std::string out;
  // The role must give a password; the first matching pg_hba line wins, so put it first.
  {
    std::ifstream in(server.data_dir() + "/pg_hba.conf");
    std::stringstream rest;
    rest << in.rdbuf();
    std::ofstream(server.data_dir() + "/pg_hba.conf")
        << "host all pw_user 127.0.0.1/32 scram-sha-256\n"
        << rest.str();
  }
  ASSERT_EQ(run_command("psql '" + url +
                            "' -XAtq -c \"CREATE ROLE pw_user LOGIN SUPERUSER "
                            "PASSWORD 'Right-Pass-1'\" -c 'SELECT pg_reload_conf()'",
                        &out),
            0)
      << out;
  const std::string port = server.port();
  const std::string base = "postgresql://pw_user:";
  const std::string wrong = base + "Wrong-Pass-2@127.0.0.1:" + port + "/postgres";

  const std::string metrics = "127.0.0.1:" + std::to_string(free_port());
  Process node({binary("batond"), "--database-url", wrong, "--metrics-listen", metrics, "--node-id",
                "locked-out"},
               dir + "/node.log");
  ASSERT_TRUE(wait_for(
      [&] { return node.log().find("password authentication failed") != std::string::npos; }, 20s))
      << node.log();
  // Wait until the server has refused it at least three times: the node did retry.
  auto refusals = [&] {
    std::ifstream in(server.log_path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    int n = 0;
    for (auto at = all.find("password authentication failed for user \"pw_user\"");
         at != std::string::npos;
         at = all.find("password authentication failed for user \"pw_user\"", at + 1)) {
      ++n;
    }
    return n;
  };
  ASSERT_TRUE(wait_for([&] { return refusals() >= 3; }, 30s)) << "refused " << refusals();
  const auto log = node.log();
  EXPECT_TRUE(node.running()) << "a wrong password is retried, not fatal";
  std::size_t times = 0;
  for (auto at = log.find("password authentication failed"); at != std::string::npos;
       at = log.find("password authentication failed", at + 1)) {
    ++times;
  }
  EXPECT_EQ(times, 1u) << "one message per problem, not one per retry:\n" << log;
  EXPECT_EQ(log.find("Wrong-Pass-2"), std::string::npos) << log;
  EXPECT_EQ(log.find("Right-Pass-1"), std::string::npos) << log;
  EXPECT_NE(log.find("user=pw_user"), std::string::npos) << "names who it tried to be: " << log;
  EXPECT_NE(log.find("AUTHENTICATION FAILED"), std::string::npos)
      << "a wrong password is not 'unreachable': " << log;
  EXPECT_EQ(log.find("unreachable"), std::string::npos) << log;
  // Counted, so that an alert can fire while the node keeps retrying. The server logs a refusal
  // before the node hears of it, so the count may trail the server's log for a moment: wait for it.
  std::string page;
  auto counted = [&] {
    page = http_get(metrics, "/metrics");
    return metric_sum(page, "baton_database_authentication_failures_total");
  };
  EXPECT_TRUE(wait_for([&] { return counted() >= 3.0; }, 10s)) << page;
  // Never more than the server refused: each refusal is counted once.
  const double now_counted = counted();
  EXPECT_LE(now_counted, static_cast<double>(refusals())) << page;
}

}  // namespace
