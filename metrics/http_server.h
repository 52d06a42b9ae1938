// The node's metrics endpoint: /metrics in Prometheus text format, /healthz (the process answers)
// and /readyz (the database is reachable, the schema current). Served by the node's HTTP server
// (detail/http_server.h), asynchronous: idle or slow clients never hold a thread, so a port
// scanner cannot make a liveness probe fail.
//
// Thread-safety: the collectables and the readiness callback are called on the server's I/O
// thread and must be thread-safe and quick.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>

#include "baton/detail/http_server.h"

namespace baton::metrics {

class HttpServer {
 public:
  // Why the node is not ready, or "" when it is.
  using Readiness = std::function<std::string()>;

  // Binds host:port (port 0 picks one) at once; throws std::runtime_error naming the address.
  // Every sample gets the `labels` (the deployment's). `extra` routes (the console's) are served
  // beside the metrics on the same port.
  HttpServer(const std::string& listen,
             std::vector<std::weak_ptr<prometheus::Collectable>> collectables, Readiness ready,
             std::vector<prometheus::ClientMetric::Label> labels = {},
             std::vector<detail::http::Route> extra = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::string address() const { return server_->address(); }

 private:
  std::unique_ptr<detail::http::Server> server_;
};

}  // namespace baton::metrics
