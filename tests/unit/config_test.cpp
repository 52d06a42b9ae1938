// Config validation and parsing: every bad value is refused with a message naming the setting.
#include <gtest/gtest.h>

#include <cstdlib>

#include <baton/config.h>

#include "baton/detail/db.h"

namespace {

using baton::ConfigError;
using baton::Millis;
using baton::NodeConfig;
using baton::parse_duration;

NodeConfig valid() {
  NodeConfig c;
  c.database_url = "postgresql://u@127.0.0.1:5432/db";
  return c;
}

// Validates and returns the error message ("" when valid).
std::string error_of(NodeConfig c) {
  try {
    c.validate();
    return "";
  } catch (const ConfigError& e) {
    return e.what();
  }
}

TEST(Duration, ParsesEveryUnit) {
  EXPECT_EQ(parse_duration("250ms", "x"), Millis(250));
  EXPECT_EQ(parse_duration("2s", "x"), Millis(2000));
  EXPECT_EQ(parse_duration("1.5s", "x"), Millis(1500));
  EXPECT_EQ(parse_duration("3m", "x"), Millis(180000));
  EXPECT_EQ(parse_duration("1h", "x"), Millis(3600000));
  EXPECT_EQ(parse_duration("0ms", "x"), Millis(0));
}

TEST(Duration, RefusesMissingOrUnknownUnitsAndNegatives) {
  for (const char* bad : {"200", "2 s", "2sec", "-1s", "", "s", "1..2s", "5d", "ms"}) {
    try {
      parse_duration(bad, "lock-ttl");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("lock-ttl"), std::string::npos) << message;
      EXPECT_NE(message.find("250ms"), std::string::npos) << "no example of the form: " << message;
    }
  }
}

TEST(Config, DefaultsAreValidAndFillNodeId) {
  NodeConfig c = valid();
  ASSERT_NO_THROW(c.validate());
  EXPECT_NE(c.node_id.find(':'), std::string::npos) << "default node id is host:pid";
}

TEST(Config, TakesDatabaseUrlFromTheEnvironmentOrRequiresIt) {
  const char* saved = std::getenv("DATABASE_URL");
  const std::string keep = saved != nullptr ? saved : "";
  unsetenv("DATABASE_URL");
  NodeConfig c;
  EXPECT_NE(error_of(c).find("DATABASE_URL"), std::string::npos);
  setenv("DATABASE_URL", "postgresql://u@127.0.0.1:5432/db", 1);
  NodeConfig from_env;
  EXPECT_NO_THROW(from_env.validate());
  EXPECT_EQ(from_env.database_url, "postgresql://u@127.0.0.1:5432/db");
  if (saved != nullptr) {
    setenv("DATABASE_URL", keep.c_str(), 1);
  } else {
    unsetenv("DATABASE_URL");
  }
}

TEST(Config, TheLeadersOwnLeaseEndsFirstAndLeavesRoomForTwoFailedRenewals) {
  NodeConfig c = valid();
  c.lock_ttl = Millis(2000);
  c.renew_interval = Millis(2000);
  EXPECT_NE(error_of(c).find("renew-interval"), std::string::npos);
  // Own lease: 2000 x 0.99 - 100 = 1880 ms; a third is 626 ms.
  EXPECT_EQ(c.local_lease(), Millis(1880));
  c.renew_interval = Millis(627);
  const auto error = error_of(c);
  EXPECT_NE(error.find("more than a third of the leader's own lease (lock-ttl 2000ms x 0.99 - "
                       "lease-margin 100ms = 1880ms)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("use renew-interval <= 626ms"), std::string::npos) << error;
  c.renew_interval = Millis(626);
  EXPECT_EQ(error_of(c), "");
  // A margin that leaves no lease at all is refused, naming the relation.
  c.lease_margin = Millis(1970);
  EXPECT_NE(error_of(c).find("lease-margin"), std::string::npos);
  c.lease_margin = Millis(5);
  EXPECT_NE(error_of(c).find("at least 10ms"), std::string::npos);
  // The defaults keep the order: 500 ms on the database's side, 395 ms on the leader's.
  NodeConfig d = valid();
  EXPECT_EQ(d.local_lease(), Millis(395));
  EXPECT_LT(d.local_lease(), d.lock_ttl);
  EXPECT_LE(d.renew_interval * 3, d.local_lease());
}

TEST(Config, RefusesNonPositiveDurationsAndBadNumbers) {
  auto with = [](auto change) {
    NodeConfig c = valid();
    change(c);
    return error_of(c);
  };
  EXPECT_NE(with([](NodeConfig& c) { c.lock_ttl = Millis(-1); }).find("lock-ttl"),
            std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.retry_interval = Millis(0); }).find("retry-interval"),
            std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.threads = 0; }).find("threads"), std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.batch_size = 0; }).find("batch-size"), std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.schema = "Bad-Name"; }).find("schema"), std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.schema = "x\"; DROP TABLE jobs; --"; }).find("schema"),
            std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.metrics_listen = "9464"; }).find("metrics-listen"),
            std::string::npos);
  EXPECT_NE(
      with([](NodeConfig& c) { c.metrics_listen = "127.0.0.1:99999"; }).find("metrics-listen"),
      std::string::npos);
  EXPECT_EQ(with([](NodeConfig& c) { c.metrics_listen = "off"; }), "");
  EXPECT_NE(with([](NodeConfig& c) {
              c.queues = {"ok", "not ok"};
            }).find("queues"),
            std::string::npos);
  EXPECT_NE(with([](NodeConfig& c) { c.node_id = "has space"; }).find("node-id"),
            std::string::npos);
}

TEST(Config, TheClaimGatherIsZeroToAHundredMilliseconds) {
  auto with = [](auto change) {
    NodeConfig c = valid();
    change(c);
    return error_of(c);
  };
  EXPECT_EQ(with([](NodeConfig& c) { c.claim_gather = Millis(0); }), "");
  EXPECT_EQ(with([](NodeConfig& c) { c.claim_gather = Millis(100); }), "");
  for (const auto& bad : {Millis(-1), Millis(101)}) {
    const auto error = with([&](NodeConfig& c) { c.claim_gather = bad; });
    EXPECT_NE(error.find("claim-gather"), std::string::npos) << error;
    EXPECT_NE(error.find("0ms..100ms"), std::string::npos) << error;
  }
  // A poll interval below the default gather stays valid (the node cuts the gather to it).
  EXPECT_EQ(with([](NodeConfig& c) { c.poll_interval = Millis(2); }), "");
}

TEST(Config, NodeIdAndSchemaMustFitInOneSessionName) {
  NodeConfig c = valid();
  c.schema = std::string(40, 's');
  c.node_id = std::string(23, 'n');  // 23 + 1 + 40 = 64: one too many
  EXPECT_NE(error_of(c).find("62 characters"), std::string::npos);
  c.node_id = std::string(22, 'n');
  EXPECT_EQ(error_of(c), "");
  c.node_id.clear();  // the default host:pid is cut to fit
  EXPECT_EQ(error_of(c), "");
}

TEST(Config, RefusesUnparsableDatabaseUrl) {
  NodeConfig c = valid();
  c.database_url = "host=localhost port";
  EXPECT_NE(error_of(c).find("database-url"), std::string::npos);
}

TEST(DatabaseUrl, MixedFormsNeverLeakThePasswordThroughAnotherField) {
  // Found by fuzz_conninfo (tests/fuzz/regressions/conninfo): libpq parses this as a URI whose
  // host is " password=...", and the description used to print that host.
  for (const char* url : {"postgresql:// password=Fuzz-Secret-7",
                          "postgresql://db.example/app password=Fuzz-Secret-7",
                          "host='db password=Fuzz-Secret-7' dbname=app"}) {
    try {
      EXPECT_EQ(baton::describe_database_url(url).find("Fuzz-Secret-7"), std::string::npos) << url;
    } catch (const ConfigError&) {
      // refusing it is fine too
    }
    EXPECT_EQ(baton::redact_database_url(url).find("Fuzz-Secret-7"), std::string::npos) << url;
  }
}

TEST(DatabaseUrl, DescriptionNeverShowsThePassword) {
  for (const char* url : {"postgresql://alice:s3cret-pw@db.example:5433/app?sslmode=require",
                          "host=db.example port=5433 dbname=app user=alice password=s3cret-pw"}) {
    const std::string d = baton::describe_database_url(url);
    EXPECT_EQ(d.find("s3cret-pw"), std::string::npos) << d;
    EXPECT_NE(d.find("host=db.example"), std::string::npos) << d;
    EXPECT_NE(d.find("user=alice"), std::string::npos) << d;
  }
}

}  // namespace

namespace {

TEST(Scrub, PasswordsInErrorMessagesAreHidden) {
  EXPECT_EQ(baton::detail::scrub("database \"app password=hunter2\" does not exist"),
            "database \"app password=********\" does not exist");
  EXPECT_EQ(baton::detail::scrub("a password=x&b password='y' c"),
            "a password=********&b password=******** c");
  EXPECT_EQ(baton::detail::scrub("nothing here"), "nothing here");
}

}  // namespace
