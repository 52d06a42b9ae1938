// Process-wide enqueue tally (see enqueue_counts.h).
#include "baton/detail/enqueue_counts.h"

#include <mutex>

namespace baton::detail {
namespace {

std::mutex& tally_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<std::string, std::string>, std::int64_t>& tally() {
  static std::map<std::pair<std::string, std::string>, std::int64_t> t;
  return t;
}

}  // namespace

void count_enqueued(const std::string& queue, const std::string& type, std::int64_t n) {
  std::lock_guard lock(tally_mutex());
  tally()[{queue, type}] += n;
}

std::map<std::pair<std::string, std::string>, std::int64_t> enqueued_counts() {
  std::lock_guard lock(tally_mutex());
  return tally();
}

}  // namespace baton::detail
