// Every example program runs against the real database and does what it says.
#include <gtest/gtest.h>

#include <filesystem>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/cluster.h"

namespace {

using namespace baton::test;

std::string example(const std::string& name) {
  return std::string(BATON_BIN_DIR) + "/../../examples/" + name;
}

class Examples : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = unique_schema(::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = temp_dir(schema_);
    auto conn = baton::detail::connect({.url = database_url(), .schema = schema_});
    baton::detail::migrate(*conn, schema_);
    db_ = connect(schema_);
  }
  std::map<std::string, std::string> env() const {
    return {{"DATABASE_URL", database_url()}, {"BATON_SCHEMA", schema_}};
  }
  long long count(const std::string& sql) { return query_int(*db_, sql); }
  void enqueue(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    tx.exec(sql);
  }
  std::string schema_, dir_;
  std::unique_ptr<pqxx::connection> db_;
};

TEST_F(Examples, EmailSenderDeliversRetriesAndDeadLetters) {
  Process node({example("email_sender"), dir_ + "/outbox"}, dir_ + "/node.log", env());
  enqueue(
      "SELECT enqueue_many((SELECT jsonb_agg(jsonb_build_object('type', 'send_email', "
      "'payload', jsonb_build_object('to', 'user' || i || '@example.com', 'subject', 'hi'))) "
      "FROM generate_series(1, 20) i))");
  enqueue("SELECT enqueue('default', 'send_email', '{\"to\": \"nobody\", \"subject\": \"x\"}')");
  enqueue(
      "SELECT enqueue('default', 'send_email', '{\"to\": \"a@mx.invalid\", \"subject\": "
      "\"x\"}', max_attempts => 2)");
  ASSERT_TRUE(wait_for(
      [&] {
        return count("SELECT count(*) FROM job_history") == 20 &&
               count("SELECT count(*) FROM dead_jobs") == 2;
      },
      60s))
      << node.log();
  std::size_t files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_ + "/outbox")) {
    files += f.path().extension() == ".eml" ? 1 : 0;
  }
  EXPECT_EQ(files, 20u);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE reason = 'discarded' AND attempts = 1"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM dead_jobs WHERE reason = 'exhausted' AND attempts = 2"), 1);
}

TEST_F(Examples, SmsPartitionedSendsEachNumbersMessagesInOrder) {
  Process node({example("sms_partitioned")}, dir_ + "/node.log", env());
  ASSERT_TRUE(wait_for(
      [&] { return count("SELECT count(*) FROM queue_state WHERE queue = 'sms'") == 1; }, 20s))
      << node.log();
  enqueue(
      "SELECT enqueue_many((SELECT jsonb_agg(jsonb_build_object('type', 'send_sms', 'queue', "
      "'sms', 'partition_key', '+' || (i % 5), 'payload', jsonb_build_object('to', '+' || "
      "(i % 5), 'text', 'message ' || i)) ORDER BY i) FROM generate_series(1, 60) i))");
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM sms_log") == 60; }, 60s))
      << node.log();
  // Per number, the log (by insertion) follows the enqueue order (by job id).
  EXPECT_EQ(count("SELECT count(*) FROM (SELECT destination, job_id, lag(job_id) OVER "
                  "(PARTITION BY destination ORDER BY id) AS prev FROM sms_log) x "
                  "WHERE prev > job_id"),
            0);
}

TEST_F(Examples, OrderSagaShipsPaidOrdersAndCancelsUnpaidOnes) {
  Process node({example("order_saga")}, dir_ + "/node.log", env());
  enqueue("SELECT enqueue('default', 'order_placed', '{\"order_id\": \"A\"}')");
  enqueue(
      "SELECT enqueue('default', 'order_placed', '{\"order_id\": \"B\", \"pay_within_ms\": "
      "200}')");
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM sagas") == 2; }, 30s))
      << node.log();
  enqueue("SELECT enqueue('default', 'payment_received', '{\"order_id\": \"A\"}')");
  ASSERT_TRUE(wait_for(
      [&] { return count("SELECT count(*) FROM sagas WHERE completed_at IS NOT NULL") == 2; }, 30s))
      << node.log();
  EXPECT_EQ(count("SELECT count(*) FROM sagas WHERE data->>'state' = 'shipped'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM sagas WHERE data->>'state' = 'cancelled'"), 1);
}

TEST_F(Examples, ProducerEnqueuesABatchAndAJobInsideItsOwnTransaction) {
  std::string out;
  const int rc = run_command("env DATABASE_URL='" + database_url() + "' BATON_SCHEMA=" + schema_ +
                                 " " + example("producer") + " 500",
                             &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("batch: 500 jobs"), std::string::npos) << out;
  EXPECT_NE(out.find("in one transaction: order"), std::string::npos) << out;
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE queue = 'reports'"), 500);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE queue = 'mail' AND idempotency_key LIKE "
                  "'order-%'"),
            1);
  EXPECT_EQ(run_command("env -u DATABASE_URL " + example("producer"), &out), 2) << out;
}

}  // namespace
