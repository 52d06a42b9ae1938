// The operator console: pages in the browser, served by any node that is asked to
// (--console-listen), reading PostgreSQL so that every node shows the same. The cluster and its
// leadership timeline, queues with their last hour, jobs and one job's story, dead letters,
// schedules and sagas; actions (pause, resume, retry, discard, step down) behind a confirmation,
// a CSRF token, and, beyond loopback, a token. docs/console.md says what each page shows.
//
// Thread-safety: a Console is driven by its owner only; requests run on its own I/O thread and
// worker pool, each with a connection of its own from a small pool.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "baton/detail/db.h"

namespace baton::console {

struct ConsoleConfig {
  std::string listen;              // host:port; port 0 picks one
  detail::ConnectOptions connect;  // the console's role and schema
  std::string node_id;             // shown in the page's header
  std::string version;
  std::string token;  // empty: none (the node allows that on loopback only)
  bool read_only = false;
  int worker_threads = 2;  // requests querying the database at once
  // Called once per answer with its kind (page, read, action) and status; thread-safe.
  std::function<void(std::string_view kind, int status)> observe;
};

class Console {
 public:
  // Binds at once; throws std::runtime_error naming the address when it cannot.
  explicit Console(ConsoleConfig config);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  std::string address() const;

  struct Impl;  // the connection pool, the caches and the routes' state

 private:
  std::shared_ptr<Impl> impl_;
};

// The token in `path`: its first line, trimmed. Throws baton::ConfigError naming the setting
// when the file cannot be read or the token is shorter than 16 characters.
std::string read_token_file(const std::string& path);

}  // namespace baton::console
