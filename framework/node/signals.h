// Turns SIGTERM/SIGINT into calls, on a thread of its own, for Node::run().
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace baton::detail {

class SignalWatcher {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread (and so in threads it starts later) and
  // calls on_signal(n) for the n-th signal received (n = 1, 2, ...).
  explicit SignalWatcher(std::function<void(int)> on_signal);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace baton::detail
