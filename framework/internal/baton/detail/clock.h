// The steady clock as a count of nanoseconds, for instants kept in atomics.
#pragma once

#include <chrono>
#include <cstdint>

namespace baton::detail {

inline std::int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline std::int64_t steady_now_ns() {
  return steady_ns(std::chrono::steady_clock::now());
}

}  // namespace baton::detail
