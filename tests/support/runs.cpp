// Reading node logs and run logs (see runs.h).
#include "support/runs.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

namespace baton::test {

std::optional<std::chrono::system_clock::time_point> logged_at(
    const std::string& log, const std::string& text, std::chrono::system_clock::time_point from) {
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find(text) == std::string::npos) continue;
    std::tm tm{};
    int ms = 0;
    if (std::sscanf(line.c_str(), "%d-%d-%dT%d:%d:%d.%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                    &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
      continue;
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    tm.tm_isdst = -1;
    const auto at =
        std::chrono::system_clock::from_time_t(std::mktime(&tm)) + std::chrono::milliseconds(ms);
    if (at + std::chrono::milliseconds(1) >= from) return at;
  }
  return std::nullopt;
}

std::map<long long, std::vector<LoggedRun>> read_runs(const std::string& path) {
  std::map<std::string, LoggedRun> open;  // by "job attempt epoch node"
  std::map<long long, std::vector<LoggedRun>> runs;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string what, rest;
    LoggedRun r;
    long long us = 0;
    if (!(f >> what >> r.job >> r.attempt >> r.epoch >> r.node >> us)) continue;
    const std::string id = std::to_string(r.job) + " " + std::to_string(r.attempt) + " " +
                           std::to_string(r.epoch) + " " + r.node;
    if (what == "start" && f >> r.allowed_us >> r.key) {
      r.start_us = us;
      open[id] = r;
    } else if (what == "end" && f >> rest && open.contains(id)) {
      auto done = open[id];
      done.end_us = us;
      done.cancelled = rest == "cancelled";
      runs[done.job].push_back(done);
      open.erase(id);
    }
  }
  for (const auto& [id, run] : open)
    runs[run.job].push_back(run);
  for (auto& [job, list] : runs) {
    std::sort(list.begin(), list.end(),
              [](const LoggedRun& a, const LoggedRun& b) { return a.start_us < b.start_us; });
  }
  return runs;
}

std::string overlapping_runs(const std::string& path) {
  auto who = [](const LoggedRun& r) {
    return "attempt " + std::to_string(r.attempt) + " (epoch " + std::to_string(r.epoch) + ", " +
           r.node + ")";
  };
  for (const auto& [job, list] : read_runs(path)) {
    for (std::size_t i = 1; i < list.size(); ++i) {
      if (list[i].start_us < list[i - 1].end_us) {
        return "job " + std::to_string(job) + ": " + who(list[i]) + " started at " +
               std::to_string(list[i].start_us) + " us while " + who(list[i - 1]) +
               (list[i - 1].end_us == std::numeric_limits<long long>::max()
                    ? " never ended"
                    : " ran until " + std::to_string(list[i - 1].end_us) + " us");
      }
    }
  }
  return "";
}

}  // namespace baton::test
