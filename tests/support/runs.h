// What nodes wrote down, read back by tests: the time of a log line, and the runs that the
// record_run handler logged (examples/builtin), to prove that no two runs of one job overlap.
#pragma once

#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace baton::test {

// The instant of the first line of `log` at or after `from` that contains `text` (node log lines
// start "YYYY-MM-DDTHH:MM:SS.mmm", local time, millisecond resolution), or nullopt.
std::optional<std::chrono::system_clock::time_point> logged_at(
    const std::string& log, const std::string& text,
    std::chrono::system_clock::time_point from = {});

// One run of one job as record_run logged it: [start, end) in microseconds since the epoch; a
// run that never logged its end lasts for ever.
struct LoggedRun {
  long long job = 0;
  int attempt = 0;
  long long epoch = 0;
  std::string node;
  long long start_us = 0;
  long long allowed_us = 0;  // JobContext::started_at(): read before the node's lease check
  long long end_us = std::numeric_limits<long long>::max();
  std::string key;  // the idempotency key the handler saw
  bool cancelled = false;
};

// Every run in a run log, by job, in order of start.
std::map<long long, std::vector<LoggedRun>> read_runs(const std::string& path);

// "" when no two runs of one job overlap in time, else a description of the first overlap.
std::string overlapping_runs(const std::string& path);

}  // namespace baton::test
