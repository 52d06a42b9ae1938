// ProcessCollector (see process_collector.h). Linux only: it reads /proc/self.
#include "metrics/process_collector.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace baton::metrics {
namespace {

prometheus::MetricFamily family(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return {name, help, type, {m}};
}

}  // namespace

ProcessCollector::ProcessCollector()
    : start_time_seconds_(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count()) {}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  {
    // Fields 14 and 15 of /proc/self/stat are utime and stime in clock ticks; the command name
    // (field 2) may hold spaces, so count from its closing parenthesis.
    std::ifstream in("/proc/self/stat");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream rest(all.substr(all.rfind(')') + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stod(field);
      if (i == 15) stime = std::stod(field);
    }
    out.push_back(family("process_cpu_seconds_total",
                         "Total user and system CPU time spent in seconds.", MetricType::Counter,
                         (utime + stime) / ticks));
  }
  {
    std::ifstream in("/proc/self/statm");
    double size = 0, resident = 0;
    in >> size >> resident;
    out.push_back(family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                         MetricType::Gauge, size * page));
    out.push_back(family("process_resident_memory_bytes", "Resident memory size in bytes.",
                         MetricType::Gauge, resident * page));
  }
  {
    std::error_code ec;
    double fds = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++fds;
    }
    out.push_back(
        family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, fds));
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    out.push_back(family("process_max_fds", "Maximum number of open file descriptors.",
                         MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  out.push_back(family("process_start_time_seconds",
                       "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
                       start_time_seconds_));
  return out;
}

}  // namespace baton::metrics
