// Waker: lets any thread wake one that waits in poll(), on its own or together with a socket (a
// connection that LISTENs). One eventfd; wait() takes the pending wakes, so a wake ends one wait
// and not every later one.
//
// Thread-safety: wake() from any thread; wait() from one thread at a time.
#pragma once

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
};

}  // namespace baton::detail
