// HttpServer (see http_server.h).
#include "metrics/http_server.h"

#include <CivetServer.h>

#include <prometheus/text_serializer.h>

#include <stdexcept>

namespace baton::metrics {
namespace {

void reply(mg_connection* conn, int status, const char* reason, const std::string& content_type,
           const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            status, reason, content_type.c_str(), body.size());
  mg_write(conn, body.data(), body.size());
}

}  // namespace

struct HttpServer::Handlers {
  struct Metrics : CivetHandler {
    std::vector<std::weak_ptr<prometheus::Collectable>> collectables;
    bool handleGet(CivetServer*, mg_connection* conn) override {
      std::vector<prometheus::MetricFamily> families;
      for (const auto& weak : collectables) {
        if (auto c = weak.lock()) {
          auto more = c->Collect();
          families.insert(families.end(), std::make_move_iterator(more.begin()),
                          std::make_move_iterator(more.end()));
        }
      }
      reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8",
            prometheus::TextSerializer().Serialize(families));
      return true;
    }
  } metrics;
  struct Health : CivetHandler {
    bool handleGet(CivetServer*, mg_connection* conn) override {
      reply(conn, 200, "OK", "text/plain", "ok\n");
      return true;
    }
  } health;
  struct Ready : CivetHandler {
    Readiness ready;
    bool handleGet(CivetServer*, mg_connection* conn) override {
      const std::string why = ready ? ready() : "";
      if (why.empty()) {
        reply(conn, 200, "OK", "text/plain", "ready\n");
      } else {
        reply(conn, 503, "Service Unavailable", "text/plain", "not ready: " + why + "\n");
      }
      return true;
    }
  } readiness;
};

HttpServer::HttpServer(const std::string& listen,
                       std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                       Readiness ready)
    : handlers_(std::make_unique<Handlers>()) {
  handlers_->metrics.collectables = std::move(collectables);
  handlers_->readiness.ready = std::move(ready);
  try {
    server_ = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads", "2"});
  } catch (const std::exception& e) {
    throw std::runtime_error("metrics-listen: cannot serve on " + listen + " (" + e.what() +
                             "); choose a free host:port, or off");
  }
  server_->addHandler("/metrics", handlers_->metrics);
  server_->addHandler("/healthz", handlers_->health);
  server_->addHandler("/readyz", handlers_->readiness);
  const auto ports = server_->getListeningPorts();
  address_ =
      listen.substr(0, listen.rfind(':')) + ":" + std::to_string(ports.empty() ? 0 : ports.front());
}

HttpServer::~HttpServer() {
  if (server_) server_->close();
}

}  // namespace baton::metrics
