// Jobs enqueued by the Clients of this process, per queue and type, for the metrics. A plain
// process-wide tally (mutex-guarded): Clients add after their commit, metrics read at scrape.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace baton::detail {

void count_enqueued(const std::string& queue, const std::string& type, std::int64_t n);
std::map<std::pair<std::string, std::string>, std::int64_t> enqueued_counts();

}  // namespace baton::detail
