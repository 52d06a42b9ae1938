// Strings and numbers a handler (or a producer) may throw at baton: text PostgreSQL refuses, a
// delay no interval holds, numbers that would wrap. None of them may hold up another job's
// outcome, on this leader or the next, and none may be stored in a form PostgreSQL refuses.
#include <gtest/gtest.h>

#include <random>

#include <baton/baton.h>

#include "baton/detail/text.h"
#include "support/node_runner.h"
#include "support/schema_test.h"
#include "worker/completer.h"

namespace {

using namespace baton::test;
using baton::JobContext;
using baton::Node;

// Handlers' messages that PostgreSQL refuses as they are (each a separate reason).
const std::vector<std::string> kBadTexts{
    std::string("surrogate \xED\xA0\x80 half"),                // UTF-16 surrogate U+D800
    std::string("overlong \xC0\xAF slash"),                    // overlong '/'
    std::string("overlong3 \xE0\x80\xAF slash"),               // overlong in 3 bytes
    std::string("too high \xF4\x90\x80\x80 beyond U+10FFFF"),  // U+110000
    std::string("nul \0 inside", 12),                          // NUL
    std::string("truncated \xE2\x82"),                         // cut inside a character
    std::string("line\nbreak\r\nand \x1b[31m escape"),         // valid, but not one log line
};

class HostileStrings : public SchemaTest {};

TEST_F(HostileStrings, BadTextAndAnEndlessRetryDelayNeverHoldUpOtherOutcomes) {
  std::atomic<int> next{0};
  RunningNode n(test_config(schema_, "solo"), [&](Node& node) {
    node.handle("noop", [](JobContext&) {});
    node.handle("bad_text", [&](JobContext&) {
      throw std::runtime_error(kBadTexts[static_cast<std::size_t>(next++) % kBadTexts.size()]);
    });
    node.handle("forever", [](JobContext&) {
      throw baton::RetryIn(std::chrono::milliseconds::max(), "see you in a long while");
    });
  });
  baton::Client client(database_url(), schema_);
  for (std::size_t i = 0; i < kBadTexts.size(); ++i)
    client.enqueue("bad_text", {}, {.max_attempts = 1});
  client.enqueue("forever", {});
  for (int i = 0; i < 20; ++i)
    client.enqueue("noop", {});
  ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 20)) << "outcomes were held up";
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM dead_jobs", static_cast<long long>(kBadTexts.size())));
  // Each message is stored as clean_text makes it (what() ends at a NUL, as for any C string).
  for (const auto& text : kBadTexts) {
    const auto stored = baton::detail::clean_text(std::string(text.c_str()), 4000);
    const auto n =
        pqxx::nontransaction(*db_)
            .exec_params("SELECT count(*) FROM dead_jobs WHERE last_error = $1", stored)[0][0]
            .as<int>();
    EXPECT_EQ(n, 1) << stored;
  }
  ASSERT_TRUE(
      wait_count("SELECT count(*) FROM jobs WHERE type = 'forever' AND state = 'available' "
                 "AND run_at > now() + interval '50 years'",
                 1))
      << "an endless RetryIn must become the longest delay, not an error";
}

TEST_F(HostileStrings, ABatchPostgresRefusesIsWrittenOneOutcomeAtATime) {
  // Jobs claimed by this test as leader; the completer gets 20 completions and one failure with
  // a delay no interval holds (what an unchecked RetryIn would send): a data error for the
  // batch. The completions must land, and the failure must be recorded with a safe message.
  {
    pqxx::nontransaction tx(*db_);
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) "
        "VALUES ('baton-leader', 'default', 'me', 1, now() + interval '1 minute')");
    tx.exec("INSERT INTO jobs (queue, type) SELECT 'q', 'noop' FROM generate_series(1, 21)");
  }
  auto conn = baton::detail::connect({.url = database_url(), .schema = schema_});
  const auto jobs = baton::detail::claim_jobs(*conn, {{"baton-leader", "default"}, "me", 1}, 100,
                                              {{}, {}, {"noop"}});
  ASSERT_EQ(jobs.size(), 21u);
  baton::worker::Completer completer({.url = database_url(), .schema = schema_}, nullptr);
  completer.start();
  completer.add(baton::detail::Failure{jobs[0].job.id, 1, jobs[0].token, 1, "bad delay", false, "",
                                       std::numeric_limits<std::int64_t>::max()});
  for (std::size_t i = 1; i < jobs.size(); ++i)
    completer.add(baton::detail::Completion{jobs[i].job.id, 1, jobs[i].token, 0.01});
  ASSERT_TRUE(completer.wait_flushed(std::chrono::seconds(20)));
  completer.stop(std::chrono::seconds(1));
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 20);
  EXPECT_EQ(count("SELECT count(*) FROM jobs WHERE state = 'available' AND last_error LIKE "
                  "'the outcome could not be recorded as it was%bad delay'"),
            1);
}

// Whatever bytes a handler throws, what clean_text keeps is text PostgreSQL accepts, and what
// valid_utf8 accepts PostgreSQL accepts too: checked against the server's own validation.
TEST_F(HostileStrings, CleanedTextIsWhatPostgresAcceptsForManyRandomByteStrings) {
  std::mt19937 rng(20261123);
  std::uniform_int_distribution<int> len(0, 24), byte(0, 255), pick(0, 9);
  std::vector<std::string> samples;
  for (int i = 0; i < 4000; ++i) {
    std::string s;
    const int n = len(rng);
    for (int k = 0; k < n; ++k) {
      // Mostly the bytes where UTF-8 is decided: leads, continuations and the edges.
      static const int interesting[] = {0x00, 0x7f, 0x80, 0xbf, 0xc0, 0xc2, 0xdf, 0xe0,
                                        0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0x9f, 0xa0};
      s += static_cast<char>(pick(rng) < 6 ? interesting[byte(rng) % 16] : byte(rng));
    }
    samples.push_back(s);
  }
  for (const auto& s : samples) {
    const auto cleaned = baton::detail::clean_text(s, 4000);
    ASSERT_TRUE(baton::detail::valid_utf8(cleaned));
    EXPECT_NO_THROW(pqxx::nontransaction(*db_).exec_params("SELECT $1::text", cleaned))
        << "PostgreSQL refused what clean_text kept";
    // PostgreSQL decides on the raw bytes: convert_from raises for what it refuses.
    std::string hex;
    for (unsigned char c : s) {
      static const char* digits = "0123456789abcdef";
      hex += digits[c >> 4];
      hex += digits[c & 15];
    }
    bool accepted = true;
    try {
      pqxx::nontransaction(*db_).exec("SELECT convert_from('\\x" + hex + "'::bytea, 'UTF8')");
    } catch (const pqxx::sql_error&) {
      accepted = false;  // PostgreSQL refuses NUL as well
    }
    EXPECT_EQ(accepted, baton::detail::valid_utf8(s))
        << "baton and PostgreSQL disagree on the bytes " << hex;
    if (accepted) {
      EXPECT_EQ(cleaned, s) << "valid text was changed";
    }
  }
}

}  // namespace
