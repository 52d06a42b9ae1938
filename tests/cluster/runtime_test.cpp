// batond as operators run it: pausing queues, signals, layered settings, JSON logs.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/cluster.h"

namespace {

using namespace baton::test;

TEST(Runtime, APausedQueueKeepsItsJobsUntilResumed) {
  Cluster cluster(unique_schema("pause"), 1);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  int rc = 0;
  const auto out = ctl(cluster, "queue pause mail", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("queue mail paused"), std::string::npos) << out;
  ctl(cluster, "enqueue --type noop --queue mail --count 5");
  ctl(cluster, "enqueue --type noop --queue other --count 5");
  // The other queue's jobs, enqueued after, finish: the leader has claimed since the pause.
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 5; }, 20s));
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs WHERE queue = 'mail' AND state = 'available'"),
            5);
  EXPECT_NE(ctl(cluster, "--json queue list").find("\"paused\": true"), std::string::npos);
  ASSERT_EQ((ctl(cluster, "queue resume mail", &rc), rc), 0);
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 10; }, 20s))
      << cluster.logs();
  ctl(cluster, "queue pause 'bad name'", &rc);
  EXPECT_EQ(rc, 2) << "a bad queue name is a usage error";
}

TEST(Runtime, ASecondSigtermExitsAtOnceAndTheNextLeaderRescuesTheJobs) {
  Cluster cluster(unique_schema("sigterm2"), 2);
  const auto first = cluster.wait_leader(20s);
  ASSERT_NE(first, "") << cluster.logs();
  ctl(cluster,
      "enqueue --type sleep --payload '{\"ms\": 1500, \"ignore_cancel\": true}' --count 4");
  ASSERT_TRUE(wait_for(
      [&] { return cluster.count("SELECT count(*) FROM jobs WHERE state = 'running'") == 4; },
      20s));
  cluster.process(first).signal(SIGTERM);
  ASSERT_TRUE(wait_for(
      [&] { return cluster.process(first).log().find("draining") != std::string::npos; }, 10s));
  cluster.process(first).signal(SIGTERM);
  EXPECT_EQ(cluster.process(first).wait(1s), 1) << "the second signal must exit at once";
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 4; }, 30s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE node = '" + first + "'"), 0)
      << "the abandoned jobs ran again on the next leader";
}

TEST(Runtime, SettingsComeFromFlagsThenEnvironmentThenFileThenDefaults) {
  const std::string dir = temp_dir("settings");
  std::ofstream(dir + "/batond.toml") << "threads = 3\nbatch-size = 7\nlock-ttl = \"3s\"\n"
                                         "queues = [\"a\", \"b\"]\nregion = \"from-file\"\n";
  std::string out;
  const std::string cmd =
      "env DATABASE_URL='postgresql://ada:s3cret@db:5432/app' BATON_THREADS=5 "
      "BATON_REGION=from-env " +
      binary("batond") + " --config " + dir +
      "/batond.toml --region from-flag "
      "--print-config";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("region = \"from-flag\""), std::string::npos) << out;  // flag beats all
  EXPECT_NE(out.find("threads = 5"), std::string::npos) << out;             // env beats file
  EXPECT_NE(out.find("batch-size = 7"), std::string::npos) << out;          // file beats default
  EXPECT_NE(out.find("lock-ttl = \"3s\""), std::string::npos) << out;
  EXPECT_NE(out.find("queues = [\"a\",\"b\"]"), std::string::npos) << out;
  EXPECT_NE(out.find("renew-interval = \"100ms\""), std::string::npos) << out;  // default
  EXPECT_EQ(out.find("s3cret"), std::string::npos) << "the password leaked: " << out;
  EXPECT_NE(out.find("ada:********@db"), std::string::npos) << out;
}

TEST(Runtime, EveryBadSettingNamesTheSettingAndItsSource) {
  const std::string dir = temp_dir("bad_settings");
  std::ofstream(dir + "/bad.toml") << "lock-ttl = \"soon\"\n";
  std::ofstream(dir + "/unknown.toml") << "thread = 4\n";
  std::ofstream(dir + "/broken.toml") << "threads = \n";
  struct Case {
    std::string env, flags, expect;
  };
  const std::vector<Case> cases{
      {"BATON_THREADS=lots", "", "threads: 'lots' is not a whole number (from BATON_THREADS)"},
      {"", "--config " + dir + "/bad.toml", "lock-ttl: 'soon' is not a duration"},
      {"", "--config " + dir + "/bad.toml", "(from " + dir + "/bad.toml, key lock-ttl)"},
      {"", "--config " + dir + "/unknown.toml", "unknown setting 'thread'"},
      {"", "--config " + dir + "/broken.toml", "is not valid TOML"},
      {"", "--config " + dir + "/missing.toml", "missing.toml"},
      {"", "--queue-concurrency mail", "queue-concurrency: 'mail' is not queue=N"},
      {"", "--queue-concurrency mail=99 --threads 4", "use 1..threads"},
      {"", "--log-format xml", "log-format: 'xml' is not text or json"},
      {"", "--migrate maybe", "migrate: 'maybe' is not true or false"},
      {"", "--history-retention 0s", "history-retention"},
  };
  for (const auto& c : cases) {
    std::string out;
    const int rc = run_command("env DATABASE_URL=postgresql://x@127.0.0.1:1/x " + c.env + " " +
                                   binary("batond") + " " + c.flags + " --print-config",
                               &out);
    EXPECT_EQ(rc, 2) << c.env << " " << c.flags << ": " << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.env << " " << c.flags << ": " << out;
  }
}

TEST(Runtime, JsonLogLinesParseAndJobLinesCarryTheJobFields) {
  Cluster cluster(unique_schema("jsonlog"), 1, {"--log-format", "json"});
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  ctl(cluster,
      "enqueue --type fail --queue q1 --max-attempts 1 --payload '{\"message\": \"a \\\"quoted\\\" "
      "error\"}'");
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM dead_jobs") == 1; }, 20s));
  cluster.process("n1").signal(SIGTERM);
  ASSERT_EQ(cluster.process("n1").wait(20s), 0);
  std::istringstream log(cluster.process("n1").log());
  int lines = 0;
  bool job_line = false;
  for (std::string line; std::getline(log, line);) {
    ++lines;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    EXPECT_TRUE(j.contains("ts") && j.contains("level") && j.contains("msg")) << line;
    EXPECT_EQ(j.value("node", ""), "n1") << line;
    if (j.contains("job")) {
      job_line = true;
      EXPECT_TRUE(j["job"].is_number()) << line;
      EXPECT_EQ(j.value("queue", ""), "q1") << line;
      EXPECT_EQ(j.value("type", ""), "fail") << line;
      EXPECT_TRUE(j.contains("epoch")) << line;
    }
  }
  EXPECT_GT(lines, 3);
  EXPECT_TRUE(job_line) << "no log line about the job";
}

}  // namespace

namespace {

using namespace baton::test;

TEST(Batonctl, DeadLettersCanBeShownRetriedAndPurgedAndJobsShown) {
  Cluster cluster(unique_schema("ctl_dead"), 1);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  int rc = 0;
  ctl(cluster,
      "enqueue --type fail --queue q --max-attempts 1 --count 3 "
      "--payload '{\"message\": \"card declined\"}'");
  ctl(cluster, "enqueue --type noop --queue q");
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM dead_jobs") == 3; }, 20s));
  ASSERT_TRUE(
      wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 1; }, 20s));
  const auto id = std::to_string(cluster.count("SELECT min(id) FROM dead_jobs"));

  auto out = ctl(cluster, "dead show " + id, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("card declined"), std::string::npos) << out;
  EXPECT_NE(out.find("exhausted"), std::string::npos) << out;
  out = ctl(cluster, "--json jobs show " + id, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"reason\": \"exhausted\""), std::string::npos) << out;
  const auto done = std::to_string(cluster.count("SELECT id FROM job_history"));
  out = ctl(cluster, "jobs show " + done, &rc);
  EXPECT_NE(out.find("finished"), std::string::npos) << out;
  ctl(cluster, "jobs show 987654321", &rc);
  EXPECT_EQ(rc, 1) << "a missing job is a failure";

  out = ctl(cluster, "dead retry " + id, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("requeued 1"), std::string::npos) << out;
  // It runs again (same id), fails again, and is back in dead_jobs with both errors.
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT jsonb_array_length(errors) FROM dead_jobs WHERE id = " + id) ==
               2;
      },
      20s))
      << cluster.logs();
  ctl(cluster, "dead retry", &rc);
  EXPECT_EQ(rc, 2) << "needs an id or --all";

  out = ctl(cluster, "dead purge --older-than 1h", &rc);
  EXPECT_NE(out.find("purged 0"), std::string::npos) << out;
  out = ctl(cluster, "--json dead purge --older-than 0ms --queue q", &rc);
  EXPECT_NE(out.find("\"purged\":3"), std::string::npos) << out;
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs"), 0);

  out = ctl(cluster, "--json stats", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"completed_1m\": 1"), std::string::npos) << out;
  EXPECT_NE(out.find("\"run_p95_s\""), std::string::npos) << out;
  ctl(cluster, "queue ordered sms --partitions 0", &rc);
  EXPECT_EQ(rc, 2);
  out = ctl(cluster, "queue ordered sms --partitions 8", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(cluster.count("SELECT partitions FROM queue_state WHERE queue = 'sms'"), 8);
}

}  // namespace

namespace {

using namespace baton::test;

TEST(OrderSaga, PlacedPaidShippedAndAnUnpaidOrderTimesOut) {
  Cluster cluster(unique_schema("order_saga"), 2);
  ASSERT_NE(cluster.wait_leader(20s), "") << cluster.logs();
  ctl(cluster, "enqueue --type order_placed --payload '{\"order_id\": \"A1\", \"amount\": 1999}'");
  ctl(cluster,
      "enqueue --type order_placed --payload '{\"order_id\": \"B2\", \"pay_within_ms\": 300}'");
  // Payment for A1 arrives after the saga exists.
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM sagas") == 2; }, 20s));
  ctl(cluster, "enqueue --type payment_received --payload '{\"order_id\": \"A1\"}'");
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM sagas WHERE completed_at IS NOT NULL") == 2;
      },
      30s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM sagas WHERE data->>'order_id' = 'A1' AND "
                          "data->>'state' = 'shipped'"),
            1);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM sagas WHERE data->>'order_id' = 'B2' AND "
                          "data->>'state' = 'cancelled'"),
            1);
  // A payment after the cancellation finds no open order: dead-lettered with the reason.
  ctl(cluster, "enqueue --type payment_received --payload '{\"order_id\": \"B2\"}'");
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM dead_jobs") == 1; }, 20s));
  EXPECT_EQ(
      cluster.count("SELECT count(*) FROM dead_jobs WHERE last_error LIKE 'no open order B2%'"), 1);
  int rc = 0;
  auto out = ctl(cluster, "sagas list --completed", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("order"), std::string::npos) << out;
  const auto id = query_value(cluster.db(), "SELECT id FROM sagas WHERE data->>'order_id' = 'A1'");
  out = ctl(cluster, "sagas show " + id, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"state\": \"shipped\""), std::string::npos) << out;
}

}  // namespace
