// Schedules of periodic jobs: fixed intervals and 5-field cron expressions with time zones.
// Pure computation (no database), so that every node computes the same tick times.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace baton::detail {

using SysSeconds = std::chrono::time_point<std::chrono::system_clock, std::chrono::seconds>;

class Schedule {
 public:
  virtual ~Schedule() = default;
  // The first tick strictly after `t`. Throws std::runtime_error when there is none within
  // eight years (e.g. "0 0 30 2 *").
  virtual SysSeconds next_after(SysSeconds t) const = 0;
  // How it was written, e.g. "every 5m" or "0 3 * * * Europe/Paris".
  virtual std::string describe() const = 0;
};

// Ticks at every multiple of `interval` since the Unix epoch (so all nodes agree).
// Throws ConfigError unless interval is a whole number of seconds, at least 1 s.
std::unique_ptr<Schedule> every(std::chrono::milliseconds interval);

// Standard 5-field cron (minute hour day-of-month month day-of-week) in time zone `tz` (an IANA
// name such as "Europe/Paris"; default UTC). Fields take *, numbers, ranges a-b, steps /n, lists,
// month and day names (jan..dec, sun..sat; 7 is Sunday too), and the macros @yearly, @monthly,
// @weekly, @daily (@midnight) and @hourly. When both day fields are restricted, a day matching
// either runs (as in Vixie cron). A wall time that a DST jump skips does not run that day; one
// that repeats runs once, at its first occurrence.
// Throws ConfigError naming the field, the position and the accepted range.
std::unique_ptr<Schedule> cron(std::string_view expression, std::string_view tz = "UTC");

}  // namespace baton::detail
