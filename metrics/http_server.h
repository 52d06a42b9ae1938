// HttpServer: the node's HTTP endpoint (civetweb): /metrics in Prometheus text format,
// /healthz (the process answers) and /readyz (the database is reachable and the schema current).
//
// Thread-safety: civetweb calls the handlers on its own threads; the collectables and the
// readiness callback must be thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>

class CivetServer;

namespace baton::metrics {

class HttpServer {
 public:
  // Why the node is not ready, or "" when it is.
  using Readiness = std::function<std::string()>;

  // Binds host:port (port 0 picks one) at once; throws std::runtime_error naming the address.
  HttpServer(const std::string& listen,
             std::vector<std::weak_ptr<prometheus::Collectable>> collectables, Readiness ready);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::string address() const { return address_; }

 private:
  struct Handlers;
  std::unique_ptr<Handlers> handlers_;
  std::unique_ptr<CivetServer> server_;
  std::string address_;
};

}  // namespace baton::metrics
