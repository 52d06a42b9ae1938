// Helpers shared by tests and benchmarks, free of GoogleTest: waiting for a state with a deadline,
// real child processes, a plain HTTP GET, shell commands, and Prometheus text sums.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace baton::test {

using namespace std::chrono_literals;

// Polls `done` until it holds or `timeout` passes. Returns whether it held; the caller asserts
// with a message naming what it waited for.
bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds timeout,
              std::chrono::milliseconds every = 20ms);

// A child process with its output in a log file. The destructor kills (SIGKILL) and reaps it.
// Throws std::runtime_error when it cannot start.
class Process {
 public:
  Process(std::vector<std::string> argv, const std::string& log_path,
          const std::map<std::string, std::string>& env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig);
  // Waits for the process to exit; returns its exit code (128 + signal when killed), or -1 when
  // it did not exit within the timeout.
  int wait(std::chrono::milliseconds timeout);
  // After a SIGSTOP: waits until every thread of the process has stopped (the kernel reports the
  // group stop to the parent). False when it did not within the timeout.
  bool wait_stopped(std::chrono::milliseconds timeout);
  bool running();
  std::string log() const;
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

// GET http://host:port/path; returns the body, or "" on any failure.
std::string http_get(const std::string& host_port, const std::string& path);

// One HTTP/1.0 request with the given headers (a Host header replaces the default); status 0
// when there was no HTTP answer. `headers` is the response's status line and headers as sent.
struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;
};
HttpReply http_request(const std::string& host_port, const std::string& method,
                       const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& headers = {},
                       const std::string& body = "");

// GET host:port/metrics, with the deployment label (which every sample carries) taken out, so
// that tests can look for exact series such as baton_leader 1.
std::string scrape(const std::string& host_port);

// Runs a shell command; returns its exit code and fills `output` with stdout and stderr.
int run_command(const std::string& command, std::string* output);

// Sum of every sample of `name` (exact metric name, any labels) in a Prometheus text page.
double metric_sum(const std::string& page, const std::string& name);

// Path to a built binary: a tool (batond, batonctl) or an example (demo_node, ...).
std::string binary(const std::string& name);

// A PostgreSQL server of a test's own (scripts/pg in `dir`/pg), destroyed with the object.
class ThrowawayServer {
 public:
  explicit ThrowawayServer(const std::string& dir);
  ~ThrowawayServer();
  ThrowawayServer(const ThrowawayServer&) = delete;
  ThrowawayServer& operator=(const ThrowawayServer&) = delete;

  const std::string& url() const { return url_; }
  std::string port() const;
  std::string data_dir() const { return dir_ + "/pg/data"; }
  std::string log_path() const { return dir_ + "/pg/server.log"; }

 private:
  std::string dir_;
  std::string url_;
};

// A free TCP port on 127.0.0.1 (bound and released: another process could take it meanwhile).
int free_port();

// A temporary directory for this test's logs (/tmp/baton-test-`what`-XXXXXX). It is removed at
// the end of a test program that passed (tests/support/main.cpp) or of a bench's TempDirsGuard,
// and kept, with its path on stderr, when something failed.
std::string temp_dir(const std::string& what);

// Removes every directory temp_dir made so far in this process.
void remove_temp_dirs();
// Forgets them, and prints their paths to stderr for a look at the logs.
void keep_temp_dirs();

// For a program without Google Test: at the end of its scope, removes the temporary directories,
// or keeps them when the scope ends by an exception. Declare it before what writes into them.
class TempDirsGuard {
 public:
  TempDirsGuard() = default;
  ~TempDirsGuard();
  TempDirsGuard(const TempDirsGuard&) = delete;
  TempDirsGuard& operator=(const TempDirsGuard&) = delete;
};

}  // namespace baton::test
