// A TCP proxy on loopback that can lose the network: put it between a node and PostgreSQL, then
// blackhole() it and bytes stop moving in both directions with nothing closed (no RST, no FIN),
// which is what a dead switch, a security group or a paused VM's network looks like from either
// end. heal() lets the held bytes through again, as TCP retransmission would.
//
// One thread moves the bytes (poll, bounded waits); every member may be called from any thread.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace baton::test {

class Proxy {
 public:
  // Forwards 127.0.0.1:<port()> to the server of `url` (a libpq URL or conninfo whose host is a
  // loopback address; throws otherwise).
  explicit Proxy(const std::string& url);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  int port() const { return port_; }
  // `url` (libpq URL or conninfo) with its host and port replaced by this proxy's.
  std::string url_through(const std::string& url) const;

  // From now on nothing moves and no new connection is accepted; open ones stay open.
  void blackhole();
  // Bytes move again, the held ones first; waiting connections are accepted.
  void heal();
  bool blackholed() const { return blackholed_.load(); }
  // Connections accepted so far (to tell that a node reconnected through it).
  int accepted() const { return accepted_.load(); }
  // Once: the first connection to send a message that contains `text` (a simple query's SQL,
  // such as "COMMIT") gets it delivered, and the server's answer to it is thrown away as both
  // sockets close: the client lost the answer to a statement the server ran. (The first bytes
  // from the server after the delivery count as the answer: on a session that LISTENs, a
  // notification arriving first cuts the connection while the statement may still run. One text
  // is armed at a time: arming another replaces one that has not fired.)
  void lose_answer_to(std::string text);
  // The same, but both sockets close as soon as the message is delivered, without waiting for
  // the answer: the server may still be running the statement (a COMMIT held up in a deferred
  // trigger) when the client learns that its connection is gone.
  void cut_after(std::string text);
  // Answers lost so far.
  int answers_lost() const { return answers_lost_.load(); }

 private:
  struct Pipe {
    int a = -1, b = -1;          // the client's socket, the server's socket
    std::string a_to_b, b_to_a;  // read, not yet written
    bool a_eof = false, b_eof = false;
    // lose_answer_to: 1 when the client sent the text, 2 once it was delivered whole.
    int doomed = 0;
    bool cut_at_once = false;  // cut_after: closed when delivered, not when answered
  };
  void run();
  void stop();

  std::string target_host_;
  int target_port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> blackholed_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> answers_lost_{0};
  std::mutex lose_mutex_;
  std::string lose_text_;      // under lose_mutex_
  bool lose_at_once_ = false;  // under lose_mutex_
  std::vector<Pipe> pipes_;    // the forwarding thread's alone
  std::thread thread_;
};

}  // namespace baton::test
