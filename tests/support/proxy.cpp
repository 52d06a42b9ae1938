// Loopback TCP proxy that can blackhole (see proxy.h).
#include "support/proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <libpq-fe.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace baton::test {

namespace {

constexpr std::size_t kMaxHeld = 4 << 20;  // bytes held per direction before reading pauses

[[noreturn]] void fail(const char* what) {
  throw std::system_error(errno, std::generic_category(), std::string("proxy: ") + what);
}

void set_nonblocking(int fd) {
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) fail("fcntl");
}

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// host and port of a libpq URL or conninfo.
std::pair<std::string, int> server_of(const std::string& url) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(url.c_str(), &err);
  if (opts == nullptr) {
    std::string message = err != nullptr ? err : "unparsable";
    PQfreemem(err);
    throw std::invalid_argument("proxy: cannot parse the database URL: " + message);
  }
  std::string host = "127.0.0.1", port = "5432";
  for (auto* p = opts; p->keyword != nullptr; ++p) {
    if (p->val == nullptr || *p->val == '\0') continue;
    if (std::strcmp(p->keyword, "host") == 0 || std::strcmp(p->keyword, "hostaddr") == 0) {
      host = p->val;
    }
    if (std::strcmp(p->keyword, "port") == 0) port = p->val;
  }
  PQconninfoFree(opts);
  if (host != "127.0.0.1" && host != "localhost") {
    throw std::invalid_argument(
        "proxy: the database must be on 127.0.0.1 to go through the proxy"
        " (host is " +
        host + ")");
  }
  return {"127.0.0.1", std::stoi(port)};
}

}  // namespace

Proxy::Proxy(const std::string& url) {
  auto [host, port] = server_of(url);
  target_host_ = host;
  target_port_ = port;
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail("socket");
  auto addr = loopback(0);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) fail("bind");
  if (listen(listen_fd_, 64) < 0) fail("listen");
  socklen_t len = sizeof addr;
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) < 0) fail("getsockname");
  port_ = ntohs(addr.sin_port);
  set_nonblocking(listen_fd_);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) fail("eventfd");
  thread_ = std::thread([this] { run(); });
}

Proxy::~Proxy() {
  stop();
  for (auto& p : pipes_) {
    close(p.a);
    close(p.b);
  }
  close(listen_fd_);
  close(wake_fd_);
}

void Proxy::stop() {
  stopping_.store(true);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

std::string Proxy::url_through(const std::string& url) const {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(url.c_str(), &err);
  if (opts == nullptr) {
    PQfreemem(err);
    throw std::invalid_argument("proxy: cannot parse the database URL");
  }
  auto quoted = [](const char* v) {
    std::string out = "'";
    for (const char* c = v; *c != '\0'; ++c) {
      if (*c == '\'' || *c == '\\') out += '\\';
      out += *c;
    }
    return out + "'";
  };
  std::string out = "host=127.0.0.1 port=" + std::to_string(port_);
  for (auto* p = opts; p->keyword != nullptr; ++p) {
    if (p->val == nullptr) continue;
    const std::string key = p->keyword;
    if (key == "host" || key == "hostaddr" || key == "port") continue;
    out += " " + key + "=" + quoted(p->val);
  }
  PQconninfoFree(opts);
  return out;
}

void Proxy::blackhole() {
  blackholed_.store(true);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
}

void Proxy::heal() {
  blackholed_.store(false);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
}

void Proxy::lose_answer_to(std::string text) {
  std::lock_guard lock(lose_mutex_);
  lose_text_ = std::move(text);
  lose_at_once_ = false;
}

void Proxy::cut_after(std::string text) {
  std::lock_guard lock(lose_mutex_);
  lose_text_ = std::move(text);
  lose_at_once_ = true;
}

void Proxy::run() {
  std::vector<pollfd> fds;
  char buf[64 * 1024];
  // Moves what `from` has into `held`; false when the pipe must close.
  auto pull = [&buf](int from, std::string& held, bool& eof) {
    const auto n = recv(from, buf, sizeof buf, 0);
    if (n > 0) held.append(buf, static_cast<std::size_t>(n));
    if (n == 0) eof = true;
    return n >= 0 || errno == EAGAIN || errno == EINTR;
  };
  auto push = [](int to, std::string& held) {
    const auto n = send(to, held.data(), held.size(), MSG_NOSIGNAL);
    if (n > 0) held.erase(0, static_cast<std::size_t>(n));
    return n >= 0 || errno == EAGAIN || errno == EINTR;
  };
  while (!stopping_.load()) {
    const bool dark = blackholed_.load();
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(dark ? 0 : POLLIN), 0});
    for (const auto& p : pipes_) {
      short ea = 0, eb = 0;
      if (!dark) {
        if (!p.a_eof && p.a_to_b.size() < kMaxHeld) ea |= POLLIN;
        if (!p.b_to_a.empty()) ea |= POLLOUT;
        if (!p.b_eof && p.b_to_a.size() < kMaxHeld) eb |= POLLIN;
        if (!p.a_to_b.empty()) eb |= POLLOUT;
      }
      // A side with nothing to wait for is left out, or its hang-up would wake poll at once.
      fds.push_back({ea != 0 ? p.a : -1, ea, 0});
      fds.push_back({eb != 0 ? p.b : -1, eb, 0});
    }
    if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) {
      std::uint64_t v;
      [[maybe_unused]] auto n = read(wake_fd_, &v, sizeof v);
    }
    if (blackholed_.load()) continue;  // blackholed during the wait: nothing moves
    for (std::size_t i = 0; i < pipes_.size(); ++i) {
      auto& p = pipes_[i];
      const auto ra = fds[2 + 2 * i].revents, rb = fds[3 + 2 * i].revents;
      bool ok = true;
      if (ra & (POLLIN | POLLHUP | POLLERR)) ok = ok && pull(p.a, p.a_to_b, p.a_eof);
      if (p.doomed == 0 && !p.a_to_b.empty()) {
        std::lock_guard lock(lose_mutex_);
        if (!lose_text_.empty() && p.a_to_b.find(lose_text_) != std::string::npos) {
          p.doomed = 1;
          p.cut_at_once = lose_at_once_;
          lose_text_.clear();
        }
      }
      if (rb & (POLLIN | POLLHUP | POLLERR)) ok = ok && pull(p.b, p.b_to_a, p.b_eof);
      if (p.doomed == 2 && !p.b_to_a.empty()) {
        // The protocol is one statement at a time: this is the answer to the doomed one.
        p.b_to_a.clear();
        answers_lost_.fetch_add(1);
        ok = false;
      }
      if (!p.a_to_b.empty()) ok = ok && push(p.b, p.a_to_b);
      if (p.doomed == 1 && p.a_to_b.empty()) {
        p.doomed = 2;
        if (p.cut_at_once) {
          answers_lost_.fetch_add(1);
          ok = false;
        }
      }
      if (!p.b_to_a.empty()) ok = ok && push(p.a, p.b_to_a);
      // A side that closed is passed on once what it sent has been delivered.
      if (p.a_eof && p.a_to_b.empty()) shutdown(p.b, SHUT_WR);
      if (p.b_eof && p.b_to_a.empty()) shutdown(p.a, SHUT_WR);
      if (!ok || (p.a_eof && p.b_eof && p.a_to_b.empty() && p.b_to_a.empty())) {
        close(p.a);
        close(p.b);
        p.a = p.b = -1;
      }
    }
    std::erase_if(pipes_, [](const Pipe& p) { return p.a < 0; });
    if (fds[1].revents & POLLIN) {
      for (int k = 0; k < 64; ++k) {  // bounded: the rest on the next turn
        const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client < 0) break;
        const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        auto addr = loopback(target_port_);
        if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
          if (server >= 0) close(server);
          close(client);  // the server is down: so is the proxied one
          continue;
        }
        const int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_nonblocking(client);
        set_nonblocking(server);
        pipes_.push_back({client, server, {}, {}, false, false});
        accepted_.fetch_add(1);
      }
    }
  }
}

}  // namespace baton::test
