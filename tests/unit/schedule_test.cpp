// Schedules over fixed dates: fields, the day-of-month/day-of-week rule, time zones and DST.
#include <gtest/gtest.h>

#include <cstdio>

#include <date/date.h>

#include <baton/config.h>

#include "baton/detail/schedule.h"

namespace {

using baton::detail::SysSeconds;
using namespace std::chrono;

// "2024-03-10 06:59:00" in UTC.
SysSeconds utc(const std::string& text) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  EXPECT_EQ(std::sscanf(text.c_str(), "%d-%d-%d %d:%d:%d", &y, &mo, &d, &h, &mi, &s), 6) << text;
  const date::sys_days day = date::year(y) / mo / d;
  return SysSeconds(day.time_since_epoch() + hours(h) + minutes(mi) + seconds(s));
}

std::string show(SysSeconds t) {
  return date::format("%Y-%m-%d %H:%M:%S", t);
}

std::vector<std::string> next(const baton::detail::Schedule& s, const std::string& from, int n) {
  std::vector<std::string> out;
  auto t = utc(from);
  for (int i = 0; i < n; ++i)
    out.push_back(show(t = s.next_after(t)));
  return out;
}

TEST(Schedule, EveryTicksOnMultiplesOfTheIntervalSinceTheEpoch) {
  auto s = baton::detail::every(5min);
  EXPECT_EQ(next(*s, "2024-01-01 10:02:30", 3),
            (std::vector<std::string>{"2024-01-01 10:05:00", "2024-01-01 10:10:00",
                                      "2024-01-01 10:15:00"}));
  EXPECT_EQ(show(s->next_after(utc("2024-01-01 10:05:00"))), "2024-01-01 10:10:00")
      << "strictly after";
  EXPECT_THROW(baton::detail::every(500ms), baton::ConfigError);
  EXPECT_THROW(baton::detail::every(1500ms), baton::ConfigError);
}

TEST(Schedule, CronFieldsRangesStepsListsAndNames) {
  EXPECT_EQ(next(*baton::detail::cron("*/15 9-10 * * *"), "2024-01-01 09:50:00", 3),
            (std::vector<std::string>{"2024-01-01 10:00:00", "2024-01-01 10:15:00",
                                      "2024-01-01 10:30:00"}));
  EXPECT_EQ(next(*baton::detail::cron("0 12 * JAN,mar mon-fri"), "2024-01-05 13:00:00", 2),
            (std::vector<std::string>{"2024-01-08 12:00:00", "2024-01-09 12:00:00"}));
  EXPECT_EQ(next(*baton::detail::cron("5/20 0 1 1 *"), "2024-01-01 00:00:00", 3),
            (std::vector<std::string>{"2024-01-01 00:05:00", "2024-01-01 00:25:00",
                                      "2024-01-01 00:45:00"}));
  EXPECT_EQ(next(*baton::detail::cron("0 0 * * 7"), "2024-01-01 00:00:00", 1),
            (std::vector<std::string>{"2024-01-07 00:00:00"}))
      << "7 is Sunday";
  EXPECT_EQ(next(*baton::detail::cron("@daily"), "2024-02-28 12:00:00", 2),
            (std::vector<std::string>{"2024-02-29 00:00:00", "2024-03-01 00:00:00"}));
}

TEST(Schedule, WhenBothDayFieldsAreRestrictedEitherMatches) {
  // The 13th of the month, or any Friday (Vixie cron's rule).
  EXPECT_EQ(next(*baton::detail::cron("0 0 13 * fri"), "2024-09-01 00:00:00", 3),
            (std::vector<std::string>{"2024-09-06 00:00:00", "2024-09-13 00:00:00",
                                      "2024-09-20 00:00:00"}));
}

TEST(Schedule, DailyInATimeZoneFollowsItsOffset) {
  // 03:00 in Paris is 02:00 UTC in winter and 01:00 UTC in summer.
  auto s = baton::detail::cron("0 3 * * *", "Europe/Paris");
  EXPECT_EQ(next(*s, "2024-03-30 12:00:00", 2),
            (std::vector<std::string>{"2024-03-31 01:00:00", "2024-04-01 01:00:00"}));
  EXPECT_EQ(next(*s, "2024-01-10 12:00:00", 1), (std::vector<std::string>{"2024-01-11 02:00:00"}));
}

TEST(Schedule, AWallTimeSkippedBySpringForwardDoesNotRunThatDay) {
  // New York, 2024-03-10: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist.
  auto s = baton::detail::cron("30 2 * * *", "America/New_York");
  EXPECT_EQ(next(*s, "2024-03-09 12:00:00", 2),
            (std::vector<std::string>{"2024-03-11 06:30:00", "2024-03-12 06:30:00"}));
  EXPECT_EQ(next(*s, "2024-03-08 12:00:00", 1), (std::vector<std::string>{"2024-03-09 07:30:00"}));
}

TEST(Schedule, AWallTimeRepeatedByFallBackRunsOnce) {
  // New York, 2024-11-03: 01:30 happens twice (EDT, then EST); it runs at the first.
  auto s = baton::detail::cron("30 1 * * *", "America/New_York");
  EXPECT_EQ(next(*s, "2024-11-02 12:00:00", 2),
            (std::vector<std::string>{"2024-11-03 05:30:00", "2024-11-04 06:30:00"}));
}

TEST(Schedule, BadExpressionsAreRefusedWithThePosition) {
  struct Case {
    const char* expr;
    const char* expect;
  };
  for (const auto& c :
       std::vector<Case>{{"0 25 * * *", "25 is out of range in the hour field at position 3"},
                         {"* * * *", "has 4 fields"},
                         {"*/0 * * * *", "step '0' is not a positive number in the minute field"},
                         {"0 0 * foo *", "'foo' is not a number in the month field at position 7"},
                         {"0 0 5-1 * *", "range 5-1 runs backwards in the day-of-month field"},
                         {"0 0 1,,2 * *", "an empty list item in the day-of-month field"},
                         {"60 * * * *", "60 is out of range in the minute field at position 1"}}) {
    try {
      baton::detail::cron(c.expr);
      ADD_FAILURE() << "accepted " << c.expr;
    } catch (const baton::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(baton::detail::cron("0 0 * * *", "Mars/Olympus"), baton::ConfigError);
  EXPECT_THROW(baton::detail::cron("0 0 30 2 *")->next_after(utc("2024-01-01 00:00:00")),
               std::runtime_error)
      << "February 30th never comes";
}

}  // namespace
