// The metrics endpoint (see http_server.h).
#include "metrics/http_server.h"

#include <prometheus/text_serializer.h>

namespace baton::metrics {

HttpServer::HttpServer(const std::string& listen,
                       std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                       Readiness ready, std::vector<prometheus::ClientMetric::Label> labels,
                       std::vector<detail::http::Route> extra) {
  using detail::http::Request;
  using detail::http::Response;
  std::vector<detail::http::Route> routes{
      {"/metrics",
       [collectables = std::move(collectables), labels = std::move(labels)](const Request&) {
         std::vector<prometheus::MetricFamily> families;
         for (const auto& weak : collectables) {
           if (auto c = weak.lock()) {
             auto more = c->Collect();
             families.insert(families.end(), std::make_move_iterator(more.begin()),
                             std::make_move_iterator(more.end()));
           }
         }
         // The deployment's labels on every sample, so that one Prometheus can tell apart the
         // nodes (and leaders) of several deployments.
         for (auto& family : families) {
           for (auto& metric : family.metric)
             metric.label.insert(metric.label.begin(), labels.begin(), labels.end());
         }
         return Response{200, "text/plain; version=0.0.4; charset=utf-8",
                         prometheus::TextSerializer().Serialize(families)};
       },
       true},
      {"/healthz",
       [](const Request&) {
         return Response{200, "text/plain", "ok\n"};
       },
       true},
      {"/readyz",
       [ready = std::move(ready)](const Request&) {
         const std::string why = ready ? ready() : "";
         if (why.empty()) return Response{200, "text/plain", "ready\n"};
         return Response{503, "text/plain", "not ready: " + why + "\n"};
       },
       true},
  };
  for (auto& r : extra)
    routes.push_back(std::move(r));
  try {
    server_ = std::make_unique<detail::http::Server>(detail::http::ServerOptions{.listen = listen},
                                                     std::move(routes));
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("metrics-listen: ") + e.what() + ", or off");
  }
}

HttpServer::~HttpServer() = default;

}  // namespace baton::metrics
