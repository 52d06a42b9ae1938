// Hand-written bad input against a real PostgreSQL: each refused with a clear message, nothing
// inserted; or, where it is valid, stored and run intact.
#include <gtest/gtest.h>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/node_runner.h"
#include "support/schema_test.h"
#include "support/support.h"

namespace {

using namespace baton::test;
using baton::Client;
using baton::EnqueueError;
using baton::EnqueueOptions;

class BadInput : public SchemaTest {
 protected:
  // The message of the EnqueueError the call throws ("" if none).
  template <class F>
  std::string refused(F call) {
    try {
      call();
    } catch (const EnqueueError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(BadInput, PayloadsWithNulBytesOrInvalidUtf8AreRefused) {
  Client client(database_url(), schema_);
  EXPECT_NE(refused([&] {
              client.enqueue("t", {{"s", std::string("a\0b", 3)}});
            }).find("NUL character"),
            std::string::npos);
  EXPECT_NE(refused([&] {
              client.enqueue("t", {{"s", std::string("caf\xc3", 4)}});
            }).find("not valid JSON text"),
            std::string::npos);
  EXPECT_NE(
      refused([&] { client.enqueue_json("t", "{\"unterminated\": "); }).find("not valid JSON"),
      std::string::npos);
  // Valid text with escapes that look like NUL is fine.
  EXPECT_NO_THROW(client.enqueue("t", {{"s", "a literal \\u0000 stays"}}));
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 1);
}

TEST_F(BadInput, TenMegabytePayloadsAreRefusedByDefaultAndRunWhenAllowed) {
  const std::string ten_mb(10 << 20, 'x');
  Client client(database_url(), schema_);
  EXPECT_NE(refused([&] {
              client.enqueue("t", {{"blob", ten_mb}});
            }).find("limit is 1048576"),
            std::string::npos);
  // Raised in both places: the database's limit and this client's cap.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec("UPDATE settings SET value = '20000000' WHERE key = 'max_payload_bytes'");
  }
  Client big(database_url(),
             baton::ClientOptions{.schema = schema_, .max_payload_bytes = 20'000'000});
  std::atomic<std::size_t> seen{0};
  // Every claim must come back before the lease ends; claiming (and so receiving) a 10 MB job
  // took longer than the default 500 ms lease under ThreadSanitizer on a 2-core VM, and each cut
  // claim was claimed again and cut again.
  auto config = test_config(schema_, "solo");
  config.lock_ttl = std::chrono::seconds(5);
  RunningNode n(config, [&](baton::Node& node) {
    node.handle("big", [&](baton::JobContext& ctx) {
      seen = ctx.payload()["blob"].get<std::string>().size();
    });
  });
  big.enqueue("big", {{"blob", ten_mb}});
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM job_history") == 1; }, 30s));
  EXPECT_EQ(seen.load(), ten_mb.size());
}

TEST_F(BadInput, ExtremePrioritiesAndDelaysAreRefusedOrStoredExactly) {
  Client client(database_url(), schema_);
  EXPECT_NE(refused([&] { client.enqueue("t", {}, {.priority = -40000}); }).find("priority -40000"),
            std::string::npos);
  EXPECT_NE(
      refused([&] { client.enqueue("t", {}, {.priority = 2147483647}); }).find("out of range"),
      std::string::npos);
  EXPECT_NE(refused([&] {
              client.enqueue("t", {}, {.delay = std::chrono::milliseconds(-1)});
            }).find("must not be negative"),
            std::string::npos);
  EXPECT_NE(refused([&] {
              client.enqueue("t", {}, {.delay = std::chrono::hours(24 * 365 * 200)});
            }).find("over 100 years"),
            std::string::npos);
  EXPECT_EQ(count("SELECT count(*) FROM jobs"), 0);
  client.enqueue("t", {}, {.priority = -32768});
  client.enqueue("t", {}, {.priority = 32767, .delay = std::chrono::hours(24 * 365 * 99)});
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE priority IN (-32768, 32767)"), 2);
}

TEST_F(BadInput, NamesThatLookLikeSqlAreRefusedAndTheTablesStay) {
  Client client(database_url(), schema_);
  for (const char* name : {"x'); DROP TABLE jobs; --", "\"; DROP TABLE jobs; --", "a;b", "q\"uote",
                           "back\\slash", "new\nline"}) {
    EXPECT_NE(refused([&] { client.enqueue(name, {}); }).find("not allowed"), std::string::npos)
        << name;
    EXPECT_NE(refused([&] { client.enqueue("t", {}, {.queue = name}); }).find("not allowed"),
              std::string::npos)
        << name;
  }
  EXPECT_EQ(count("SELECT count(*) FROM pg_tables WHERE schemaname = '" + schema_ +
                  "' AND tablename = 'jobs'"),
            1);
}

TEST(BadInputSchema, AReservedWordSchemaWorksBecauseEveryIdentifierIsQuoted) {
  const std::string schema = "order";  // needs quoting everywhere it appears in SQL
  track_schema(schema);
  {
    pqxx::connection conn(database_url());
    pqxx::nontransaction tx(conn);
    tx.exec("DROP SCHEMA IF EXISTS \"order\" CASCADE");
  }
  std::atomic<int> ran{0};
  RunningNode n(test_config(schema, "solo"),
                [&](baton::Node& node) { node.handle("t", [&](baton::JobContext&) { ++ran; }); });
  ASSERT_TRUE(wait_for([&] { return n.node().is_leader(); }, 20s)) << n.error();
  Client(database_url(), schema).enqueue_copies("t", {}, 5);
  auto db = connect(schema);
  ASSERT_TRUE(
      wait_for([&] { return query_int(*db, "SELECT count(*) FROM job_history") == 5; }, 20s));
  EXPECT_EQ(ran.load(), 5);
}

}  // namespace
