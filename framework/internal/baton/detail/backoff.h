// Backoff: how long to wait before trying again something that keeps failing (a lost
// connection, a refused write). The wait doubles from `first` up to `cap` and starts again at
// `first` after a success. Optional jitter (a random wait in [wait / 2, wait]) keeps nodes that
// failed together from retrying together.
//
// Thread-safety: none; each retry loop owns its own.
#pragma once

#include <algorithm>
#include <chrono>
#include <random>

namespace baton::detail {

class Backoff {
 public:
  using Millis = std::chrono::milliseconds;

  Backoff(Millis first, Millis cap) : first_(first), cap_(cap), wait_(first) {}

  // The wait before the next attempt; the one after is twice as long, up to the cap.
  Millis next() {
    const auto wait = wait_;
    wait_ = std::min(wait_ * 2, cap_);
    return wait;
  }
  // The same, drawn at random from [wait / 2, wait].
  Millis next_jittered() {
    const auto wait = next();
    std::uniform_int_distribution<Millis::rep> draw(wait.count() / 2, wait.count());
    return Millis(draw(rng_));
  }
  void reset() { wait_ = first_; }

 private:
  Millis first_;
  Millis cap_;
  Millis wait_;
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace baton::detail
