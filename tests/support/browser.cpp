// Headless Chromium over the DevTools pipe (see browser.h).
#include "support/browser.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "baton/detail/text.h"

extern char** environ;

namespace baton::test {
namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

}  // namespace

Browser::Browser(const std::string& dir) {
  if (access(kChromium, X_OK) != 0) {
    throw std::runtime_error(std::string(kChromium) +
                             " is missing: install Debian's chromium (scripts/setup does)");
  }
  std::filesystem::create_directories(dir + "/profile");
  std::array<int, 2> to{}, from{};
  if (pipe2(to.data(), O_CLOEXEC) != 0 || pipe2(from.data(), O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  const std::string log = dir + "/chromium.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // The DevTools pipe: the browser reads commands on fd 3 and writes on fd 4.
  posix_spawn_file_actions_adddup2(&actions, to[0], 3);
  posix_spawn_file_actions_adddup2(&actions, from[1], 4);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that the renderers go with it.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  // Flags for a closed machine: no background traffic to Google's hosts, no first-run UI; as
  // root Chromium needs --no-sandbox.
  std::vector<std::string> argv{kChromium,
                                "--headless",
                                "--no-sandbox",
                                "--disable-gpu",
                                "--disable-quic",
                                "--no-first-run",
                                "--disable-background-networking",
                                "--disable-component-update",
                                "--disable-sync",
                                "--disable-extensions",
                                "--disable-dev-shm-usage",
                                "--remote-debugging-pipe",
                                "--window-size=1400,1000",
                                "--user-data-dir=" + dir + "/profile",
                                "about:blank"};
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  const int rc = posix_spawn(&pid_, kChromium, &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(to[0]);
  close(from[1]);
  to_browser_ = to[1];
  from_browser_ = from[0];
  if (rc != 0) throw std::runtime_error(std::string("cannot start chromium: ") + std::strerror(rc));

  // One page, attached in flat mode: its commands carry the session id.
  const auto target = call("Target.createTarget", {{"url", "about:blank"}}, false);
  const auto attached = call("Target.attachToTarget",
                             {{"targetId", target.at("targetId")}, {"flatten", true}}, false);
  session_ = attached.at("sessionId").get<std::string>();
  call("Page.enable");
  call("Runtime.enable");
}

Browser::~Browser() {
  if (to_browser_ >= 0) {
    try {
      call("Browser.close", nlohmann::json::object(), false, std::chrono::seconds(5));
    } catch (const std::exception&) {
      // killed below
    }
  }
  if (pid_ > 0) {
    bool reaped = false;
    for (int i = 0; i < 50 && !reaped; ++i) {
      reaped = waitpid(pid_, nullptr, WNOHANG) == pid_;
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(-pid_, SIGKILL);  // the group: renderers and helpers too
    if (!reaped) waitpid(pid_, nullptr, 0);
  }
  if (to_browser_ >= 0) close(to_browser_);
  if (from_browser_ >= 0) close(from_browser_);
}

nlohmann::json Browser::read_message(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (const auto end = buffer_.find('\0'); end != std::string::npos) {
      auto message = nlohmann::json::parse(buffer_.substr(0, end));
      buffer_.erase(0, end + 1);
      return message;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("chromium did not answer in time");
    pollfd p{from_browser_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    std::array<char, 65536> chunk{};
    const auto n = read(from_browser_, chunk.data(), chunk.size());
    if (n <= 0) throw std::runtime_error("chromium closed its DevTools pipe (see chromium.log)");
    buffer_.append(chunk.data(), static_cast<std::size_t>(n));
  }
}

void Browser::note_event(const nlohmann::json& event) {
  const auto method = event.value("method", "");
  if (method == "Page.loadEventFired") loaded_ = true;
  if (method == "Runtime.consoleAPICalled") {
    for (const auto& a : event["params"]["args"])
      page_log_ += a.value("value", nlohmann::json()).dump() + " ";
    page_log_ += "\n";
  }
  if (method == "Runtime.exceptionThrown") {
    page_log_ += "uncaught: " + event["params"]["exceptionDetails"].dump() + "\n";
  }
}

nlohmann::json Browser::call(const std::string& method, nlohmann::json params, bool in_page,
                             std::chrono::milliseconds timeout) {
  const auto id = next_id_++;
  nlohmann::json message{{"id", id}, {"method", method}, {"params", std::move(params)}};
  if (in_page) message["sessionId"] = session_;
  const auto text = message.dump() + '\0';
  std::size_t sent = 0;
  while (sent < text.size()) {
    const auto n = write(to_browser_, text.data() + sent, text.size() - sent);
    if (n <= 0) throw std::runtime_error("cannot write to chromium's DevTools pipe");
    sent += static_cast<std::size_t>(n);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto reply = read_message(deadline);
    if (!reply.contains("id")) {
      note_event(reply);
      continue;
    }
    if (reply["id"] != id) continue;
    if (reply.contains("error")) {
      throw std::runtime_error(method + ": " + reply["error"].dump());
    }
    return reply.value("result", nlohmann::json::object());
  }
}

void Browser::open(const std::string& url) {
  loaded_ = false;
  const auto r = call("Page.navigate", {{"url", url}});
  if (r.contains("errorText")) throw std::runtime_error("cannot open " + url + ": " + r.dump());
  // A change of the fragment only loads nothing: the page's hashchange handler takes it.
  if (!r.contains("loaderId")) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!loaded_)
    note_event(read_message(deadline));
}

nlohmann::json Browser::eval(const std::string& expression) {
  const auto r =
      call("Runtime.evaluate",
           {{"expression", expression}, {"awaitPromise", true}, {"returnByValue", true}});
  if (r.contains("exceptionDetails")) {
    throw std::runtime_error("the page threw: " + r["exceptionDetails"].dump());
  }
  return r["result"].value("value", nlohmann::json());
}

bool Browser::wait_for(const std::string& expression, std::chrono::milliseconds timeout) {
  return baton::test::wait_for(
      [&] {
        try {
          return eval("Boolean(" + expression + ")").get<bool>();
        } catch (const std::exception&) {
          return false;
        }
      },
      timeout, std::chrono::milliseconds(100));
}

void Browser::screenshot(const std::string& path) {
  const auto shot =
      call("Page.captureScreenshot", {{"format", "png"}, {"captureBeyondViewport", true}});
  std::ofstream(path, std::ios::binary)
      << baton::detail::base64_decode(shot.at("data").get<std::string>());
}

void Browser::set_headers(const nlohmann::json& headers) {
  call("Network.enable");
  call("Network.setExtraHTTPHeaders", {{"headers", headers}});
}

}  // namespace baton::test
