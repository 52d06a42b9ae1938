// An eventfd that wakes a poll() (see waker.h).
#include "baton/detail/waker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace baton::detail {

Waker::Waker() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

Waker::~Waker() {
  ::close(fd_);
}

void Waker::wake() {
  if (signalled_.exchange(true)) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(fd_, &one, sizeof one);
}

void Waker::wait(int sock, std::chrono::milliseconds timeout) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {sock, POLLIN, 0}};
  ::poll(fds, sock >= 0 ? 2 : 1, static_cast<int>(timeout.count()));
  // Non-blocking: takes the count when there is one, else fails with EAGAIN.
  std::uint64_t pending = 0;
  [[maybe_unused]] const auto n = ::read(fd_, &pending, sizeof pending);
  // Cleared only after the count is taken: a wake from now on writes again, and one before this
  // ended this wait, so its waker's change is seen by whatever the caller does next.
  signalled_.exchange(false);  // (a read-modify-write: it sees every wake before it)
}

}  // namespace baton::detail
