// Periodic jobs against a real PostgreSQL: one job per tick, no gaps, no duplicates, missed ticks
// after downtime, schedules that disappear.
#include <gtest/gtest.h>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "support/node_runner.h"
#include "support/schema_test.h"
#include "support/support.h"

namespace {

using namespace baton::test;
using baton::JobContext;
using baton::Node;

class Periodic : public SchemaTest {
 protected:
  // The tick times (run_at, as epoch seconds) of every job of `type`, live or finished.
  std::vector<long long> ticks(const std::string& type) {
    std::vector<long long> out;
    pqxx::nontransaction tx(*db_);
    for (const auto& r : tx.exec_params(
             "SELECT extract(epoch FROM run_at)::bigint FROM (SELECT run_at FROM jobs WHERE type = "
             "$1 UNION ALL SELECT run_at FROM job_history WHERE type = $1) t ORDER BY 1",
             type)) {
      out.push_back(r[0].as<long long>());
    }
    return out;
  }
};

void tick_handlers(Node& node) {
  node.handle("tick", [](JobContext&) {});
  node.handle("other", [](JobContext&) {});
  node.every("1s", "tick");
}

TEST_F(Periodic, EverySecondGivesOneJobPerTickWithNoGapAndNoDuplicate) {
  RunningNode n(test_config(schema_, "solo"), tick_handlers);
  ASSERT_TRUE(wait_for([&] { return ticks("tick").size() >= 10; }, 30s));
  const auto t = ticks("tick");
  for (std::size_t i = 1; i < t.size(); ++i) {
    EXPECT_EQ(t[i] - t[i - 1], 1) << "tick " << i << " of " << t.size();
  }
  EXPECT_EQ(count("SELECT count(*) FROM periodic_schedules WHERE name = 'tick' AND active"), 1);
  EXPECT_GE(count("SELECT extract(epoch FROM last_tick)::bigint FROM periodic_schedules"),
            t.back());
}

TEST_F(Periodic, AfterDowntimeOnlyTheLatestMissedTickRuns) {
  {
    RunningNode n(test_config(schema_, "first"), tick_handlers);
    ASSERT_TRUE(wait_for([&] { return ticks("tick").size() >= 2; }, 30s));
  }
  const long long before = ticks("tick").back();
  // The cluster is down for at least five ticks (waiting on the database clock).
  ASSERT_TRUE(wait_for(
      [&] { return count("SELECT floor(extract(epoch FROM now()))::bigint") >= before + 6; }, 20s,
      100ms));
  RunningNode again(test_config(schema_, "second"), tick_handlers);
  // The catch-up tick and one after it. (A node that took its time to lead can catch up with a
  // tick past before + 8 on its own: waiting for that tick alone left a single one to compare.)
  std::vector<long long> after;
  ASSERT_TRUE(wait_for(
      [&] {
        after.clear();
        for (auto t : ticks("tick")) {
          if (t > before) after.push_back(t);
        }
        return after.size() >= 2 && after.back() >= before + 8;
      },
      30s));
  EXPECT_GE(after.front(), before + 6) << "an older missed tick ran";
  for (std::size_t i = 1; i < after.size(); ++i) {
    EXPECT_EQ(after[i] - after[i - 1], 1) << "after the catch-up, every tick runs";
  }
}

TEST_F(Periodic, AScheduleThatIsNoLongerDeclaredStopsButItsHistoryStays) {
  {
    RunningNode n(test_config(schema_, "v1"), [](Node& node) {
      tick_handlers(node);
      node.every("1s", "other");
    });
    ASSERT_TRUE(wait_for([&] { return ticks("other").size() >= 2; }, 30s));
  }
  const auto others = ticks("other").size();
  RunningNode n(test_config(schema_, "v2"), tick_handlers);
  ASSERT_TRUE(wait_for([&] { return ticks("tick").size() >= others + 4; }, 30s));
  EXPECT_EQ(count("SELECT count(*) FROM periodic_schedules WHERE name = 'other' AND NOT active"),
            1);
  EXPECT_EQ(ticks("other").size(), others) << "a retired schedule fired";
}

TEST_F(Periodic, BadSchedulesAreRefusedBeforeTheNodeRuns) {
  Node node(test_config(schema_, "solo"));
  try {
    node.cron("0 25 * * *", "report");
    ADD_FAILURE() << "accepted hour 25";
  } catch (const baton::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hour field at position 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(node.every("500ms", "fast"), baton::ConfigError);
  EXPECT_THROW(node.cron("0 3 * * *", "report", {}, "Nowhere/Special"), baton::ConfigError);
  node.every("1m", "ok");
  EXPECT_THROW(node.every("2m", "ok"), std::logic_error) << "a name declared twice";
}

}  // namespace
