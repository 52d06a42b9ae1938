// Lease: this node's leadership as the elector keeps it and the worker reads it: the epoch held
// and the instant (steady clock) at which this node stops leading unless it renews. The elector
// writes it, the consumer and the Node read it; neither knows the other.
//
// Thread-safety: lock-free (atomics); every member may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "baton/detail/clock.h"

namespace baton::detail {

class Lease {
 public:
  using Clock = std::chrono::steady_clock;

  // Leadership at `epoch` until `deadline`.
  void grant(std::int64_t epoch, Clock::time_point deadline) {
    deadline_ns_.store(steady_ns(deadline));
    epoch_.store(epoch);
  }
  // A renewal: the new deadline, if `epoch` is still held.
  void extend(std::int64_t epoch, Clock::time_point deadline) {
    if (epoch_.load() == epoch) deadline_ns_.store(steady_ns(deadline));
  }
  // Ends `epoch`; false when it had ended already (or another epoch is held).
  bool end(std::int64_t epoch) {
    std::int64_t expected = epoch;
    if (epoch == 0 || !epoch_.compare_exchange_strong(expected, 0)) return false;
    deadline_ns_.store(0);
    return true;
  }
  // True while `epoch` is held and its deadline has not passed, at this instant.
  bool valid(std::int64_t epoch) const {
    return epoch != 0 && epoch_.load() == epoch && steady_ns(Clock::now()) < deadline_ns_.load();
  }
  std::int64_t epoch() const { return epoch_.load(); }  // 0 when not leading
  // The deadline of the epoch held (time_point{} when none).
  Clock::time_point deadline() const {
    return Clock::time_point(std::chrono::nanoseconds(deadline_ns_.load()));
  }

 private:
  std::atomic<std::int64_t> epoch_{0};
  std::atomic<std::int64_t> deadline_ns_{0};
};

}  // namespace baton::detail
