// Waker: lets any thread wake one that waits in poll(), on its own or together with a socket (a
// connection that LISTENs). One eventfd; wait() takes the pending wakes, so a wake ends one wait
// and not every later one. Wakes between two waits cost one write to the eventfd in all (a
// finished job wakes the poller, thousands of times a second in a drain).
//
// Thread-safety: wake() from any thread; wait() from one thread at a time.
#pragma once

#include <atomic>
#include <chrono>

namespace baton::detail {

class Waker {
 public:
  Waker();  // throws std::system_error when the kernel refuses an eventfd
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  void wake();
  // Returns after wake(), when `sock` (if >= 0) has something to read, or after `timeout`.
  void wait(int sock, std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  // A wake was written and the wait after it has not yet returned: a further wake need not write.
  std::atomic<bool> signalled_{false};
};

}  // namespace baton::detail
