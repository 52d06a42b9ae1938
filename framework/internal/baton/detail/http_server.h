// A small HTTP/1.1 server on Boost.Beast for a node's endpoints (/metrics, /healthz, /readyz and
// the console). Asynchronous on one I/O thread, so idle or slow clients cost a socket each and
// never a thread: a request must arrive whole within the header timeout, an idle keep-alive
// connection is closed after the idle timeout, and connections beyond the limit are refused.
//
// Routes marked `inline` run on the I/O thread and must be quick and never block (metrics,
// health); the others run on a small worker pool and may query the database.
//
// Thread-safety: handlers run concurrently (inline ones on the I/O thread, the others on the
// pool); they must be thread-safe. The Server itself is driven only by its owner.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace baton::detail::http {

struct Request {
  std::string method;                          // GET, POST, ...
  std::string path;                            // without the query, percent-decoded
  std::map<std::string, std::string> query;    // decoded; a repeated key keeps its last value
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  std::string remote;  // the peer's address
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers{};  // extra headers
};

using Handler = std::function<Response(const Request&)>;

struct Route {
  std::string prefix;  // the path, or with a trailing '/' every path under it
  Handler handler;
  bool inline_ = false;  // run on the I/O thread (quick, never blocking)
};

struct ServerOptions {
  std::string listen;  // host:port; port 0 picks a free one
  int worker_threads = 2;
  std::chrono::milliseconds header_timeout{5000};  // a request must arrive whole within this
  std::chrono::milliseconds idle_timeout{30000};   // keep-alive connections idle this long close
  std::size_t max_connections = 512;
  std::size_t max_body_bytes = std::size_t{64} * 1024;
};

class Server {
 public:
  // Binds at once; throws std::runtime_error naming the address and what to do when it cannot.
  Server(ServerOptions options, std::vector<Route> routes);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // host:port actually bound.
  std::string address() const;

  struct Impl;  // the I/O context, the acceptor and the sessions' shared state

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace baton::detail::http
