// A real browser for tests: headless Chromium (the Debian package) driven over the DevTools
// protocol on a pipe (--remote-debugging-pipe: JSON messages ended by NUL on fds 3 and 4), so
// no WebSocket client and no Node.js are needed. Opens pages, runs JavaScript in them, waits
// for conditions with a deadline, and saves screenshots.
//
// Not thread-safe: one test thread drives one Browser.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "support/testkit.h"

namespace baton::test {

class Browser {
 public:
  // Starts Chromium with a fresh profile under `dir` (its log goes there too). Throws
  // std::runtime_error naming what to install when there is no Chromium.
  explicit Browser(const std::string& dir);
  ~Browser();
  Browser(const Browser&) = delete;
  Browser& operator=(const Browser&) = delete;

  // Navigates and waits for the load event.
  void open(const std::string& url);
  // Evaluates `expression` in the page (a promise is awaited) and returns its value; throws
  // with the page's exception text when it threw.
  nlohmann::json eval(const std::string& expression);
  // Polls `expression` until it is true or the timeout passes; returns whether it held.
  bool wait_for(const std::string& expression, std::chrono::milliseconds timeout);
  // Saves a PNG of the whole page.
  void screenshot(const std::string& path);
  // Every request carries these headers from now on (an Authorization header, say).
  void set_headers(const nlohmann::json& headers);
  // What the page's console printed and its uncaught errors, for failure messages.
  std::string page_log() const { return page_log_; }

 private:
  nlohmann::json call(const std::string& method, nlohmann::json params = nlohmann::json::object(),
                      bool in_page = true,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  nlohmann::json read_message(std::chrono::steady_clock::time_point deadline);
  void note_event(const nlohmann::json& event);

  pid_t pid_ = -1;
  int to_browser_ = -1;
  int from_browser_ = -1;
  std::string buffer_;
  long long next_id_ = 1;
  std::string session_;
  std::string page_log_;
  bool loaded_ = false;
};

}  // namespace baton::test
