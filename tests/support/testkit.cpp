// Helpers shared by tests and benchmarks (see testkit.h).
#include "support/testkit.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace baton::test {

bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds timeout,
              std::chrono::milliseconds every) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    try {
      if (done()) return true;
    } catch (const std::exception&) {
      // A state that cannot be read yet (a node not up, a table not there) is "not yet".
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

Process::Process(std::vector<std::string> argv, const std::string& log_path,
                 const std::map<std::string, std::string>& env)
    : log_path_(log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // Signals blocked in the test (none, normally) must not leak into the child.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    if (env.count(kv.substr(0, kv.find('='))) == 0) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env)
    env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  const int rc = posix_spawn(&pid_, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    kill(pid_, SIGCONT);
    waitpid(pid_, &status_, 0);
  }
}

void Process::signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

int Process::wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    const pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(10ms);
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

bool Process::wait_stopped(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || reaped_) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (r == pid_ && WIFSTOPPED(status)) return true;
    if (r == pid_) {  // it exited instead
      status_ = status;
      reaped_ = true;
      return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  return wait(0ms) == -1 && !reaped_;
}

std::string Process::log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

HttpReply http_request(const std::string& host_port, const std::string& method,
                       const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& headers,
                       const std::string& body) {
  HttpReply reply;
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return reply;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return reply;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string req = method + " " + path + " HTTP/1.0\r\n";
    bool has_host = false;
    for (const auto& [name, value] : headers) {
      req += name + ": " + value + "\r\n";
      has_host = has_host || name == "Host";
    }
    if (!has_host) req += "Host: " + host_port + "\r\n";
    if (!body.empty() || method == "POST") {
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n" + body;
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      std::array<char, 65536> buf;
      for (;;) {
        const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
        if (n <= 0) break;
        response.append(buf.data(), static_cast<std::size_t>(n));
      }
    }
  }
  close(fd);
  const auto end = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || end == std::string::npos) return reply;
  reply.status = std::atoi(response.c_str() + response.find(' ') + 1);
  reply.headers = response.substr(0, end);
  reply.body = response.substr(end + 4);
  return reply;
}

std::string http_get(const std::string& host_port, const std::string& path) {
  const auto reply = http_request(host_port, "GET", path);
  return reply.status == 200 ? reply.body : "";
}

std::string scrape(const std::string& host_port) {
  std::string page = http_get(host_port, "/metrics");
  std::string out;
  out.reserve(page.size());
  for (std::size_t i = 0; i < page.size();) {
    if (page.compare(i, 12, "deployment=\"") == 0) {
      const auto end = page.find('"', i + 12);
      if (end == std::string::npos) break;
      i = end + 1;
      if (i < page.size() && page[i] == ',') ++i;
      if (!out.empty() && out.back() == '{' && i < page.size() && page[i] == '}') {
        out.pop_back();  // the only label: no braces left
        ++i;
      }
      continue;
    }
    out += page[i++];
  }
  return out;
}

int run_command(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  std::string out;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0)
    out.append(buf.data(), n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double metric_sum(const std::string& page, const std::string& name) {
  double sum = 0;
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

namespace {

struct TempDirs {
  std::mutex mutex;
  std::vector<std::string> paths;
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string temp_dir(const std::string& what) {
  std::string tmpl = "/tmp/baton-test-" + what + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  auto& dirs = temp_dirs();
  const std::lock_guard lock(dirs.mutex);
  dirs.paths.push_back(tmpl);
  return tmpl;
}

void remove_temp_dirs() {
  auto& dirs = temp_dirs();
  const std::lock_guard lock(dirs.mutex);
  for (const auto& path : dirs.paths) {
    std::error_code error;
    std::filesystem::remove_all(path, error);
    if (error)
      std::fprintf(stderr, "could not remove %s: %s\n", path.c_str(), error.message().c_str());
  }
  dirs.paths.clear();
}

void keep_temp_dirs() {
  auto& dirs = temp_dirs();
  const std::lock_guard lock(dirs.mutex);
  for (const auto& path : dirs.paths)
    std::fprintf(stderr, "logs kept in %s\n", path.c_str());
  dirs.paths.clear();
}

TempDirsGuard::~TempDirsGuard() {
  if (std::uncaught_exceptions() > 0) {
    keep_temp_dirs();
  } else {
    remove_temp_dirs();
  }
}

std::string binary(const std::string& name) {
  // The tools (batond, batonctl), else the examples (demo_node, email_sender, ...).
  const std::string tool = std::string(BATON_BIN_DIR) + "/" + name;
  if (access(tool.c_str(), X_OK) == 0) return tool;
  return std::string(BATON_EXAMPLES_DIR) + "/" + name;
}

}  // namespace baton::test

namespace baton::test {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("cannot find a free port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace baton::test

namespace baton::test {

ThrowawayServer::ThrowawayServer(const std::string& dir) : dir_(dir) {
  run_command("chmod 755 " + dir, nullptr);  // the server runs as postgres: let it in
  std::string out;
  if (run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg start " + dir + "/pg", &out) != 0) {
    throw std::runtime_error("cannot start a throwaway PostgreSQL: " + out);
  }
  // The URL from the file scripts/pg writes, not from its output (which may carry a warning).
  std::ifstream in(dir + "/pg/url");
  std::getline(in, url_);
  if (url_.rfind("postgresql://", 0) != 0) {
    throw std::runtime_error("a throwaway PostgreSQL started but wrote no URL: " + out);
  }
}

ThrowawayServer::~ThrowawayServer() {
  run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg destroy " + dir_ + "/pg", nullptr);
}

std::string ThrowawayServer::port() const {
  return url_.substr(url_.rfind(':') + 1, url_.rfind('/') - url_.rfind(':') - 1);
}

}  // namespace baton::test
