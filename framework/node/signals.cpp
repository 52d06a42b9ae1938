// SignalWatcher: sigtimedwait on a dedicated thread, so handlers need no async-signal safety.
#include "signals.h"

#include <csignal>
#include <ctime>

namespace baton::detail {

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this, set, on_signal = std::move(on_signal)] {
    int count = 0;
    const timespec tick{0, 100'000'000};
    while (!done_.load()) {
      if (sigtimedwait(&set, nullptr, &tick) > 0) on_signal(++count);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  done_.store(true);
  thread_.join();
}

}  // namespace baton::detail
