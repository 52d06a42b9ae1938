// The node's HTTP server on Boost.Beast (see http_server.h).
#include "baton/detail/http_server.h"

#include <atomic>
#include <optional>
#include <stdexcept>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace baton::detail::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding; '+' is a space in a query. A malformed escape is kept as it is.
std::string decode(std::string_view text, bool query) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      const int hi = hex_value(text[i + 1]);
      const int lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += query && text[i] == '+' ? ' ' : text[i];
  }
  return out;
}

std::map<std::string, std::string> parse_query(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    const auto amp = q.find('&');
    const auto pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    out[decode(pair.substr(0, eq), true)] =
        eq == std::string_view::npos ? "" : decode(pair.substr(eq + 1), true);
  }
  return out;
}

std::string reason_of(int status) {
  return std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::vector<Route> routes;
  std::atomic<std::size_t> connections{0};
  std::string address;
  std::unique_ptr<net::thread_pool> workers;
  // Destroyed before the members above: pending operations (and the sessions they hold) go
  // with it, while the counters they touch still exist.
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread io_thread;

  const Route* find(const std::string& path) const {
    for (const auto& r : routes) {
      if (path == r.prefix) return &r;
      if (!r.prefix.empty() && r.prefix.back() == '/' && path.rfind(r.prefix, 0) == 0) return &r;
    }
    return nullptr;
  }
  void accept();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server::Impl& server) : server_(server), stream_(std::move(socket)) {
    beast::error_code ec;
    const auto peer = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = peer.address().to_string();
  }
  ~Session() { --server_.connections; }

  void read() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(server_.options.max_body_bytes);
    // The whole request must arrive within the timeout, however slowly it trickles in: a slow
    // client holds a socket, never a thread, and not for long.
    stream_.expires_after(server_.options.header_timeout);
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted) {
      close();
      return;
    }
    if (ec) {
      if (ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category()) {
        respond({400, "text/plain; charset=utf-8", "bad request: " + ec.message() + "\n"}, false);
      } else {
        close();
      }
      return;
    }
    auto& message = parser_->get();
    Request request;
    request.method = std::string(message.method_string());
    const std::string_view target(message.target().data(), message.target().size());
    const auto question = target.find('?');
    request.path = decode(target.substr(0, question), false);
    if (question != std::string_view::npos)
      request.query = parse_query(target.substr(question + 1));
    for (const auto& field : message) {
      std::string name(field.name_string());
      for (char& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      request.headers[name] = std::string(field.value());
    }
    request.body = std::move(message.body());
    request.remote = remote_;
    const bool keep_alive = message.keep_alive();
    const Route* route = server_.find(request.path);
    if (route == nullptr) {
      respond({404, "text/plain; charset=utf-8", "not found\n"}, keep_alive);
      return;
    }
    if (route->inline_) {
      respond(run(*route, request), keep_alive);
      return;
    }
    stream_.expires_never();
    net::post(*server_.workers,
              [self = shared_from_this(), route, request = std::move(request), keep_alive] {
                auto response = run(*route, request);
                net::post(self->stream_.get_executor(),
                          [self, response = std::move(response), keep_alive]() mutable {
                            self->respond(std::move(response), keep_alive);
                          });
              });
  }

  static Response run(const Route& route, const Request& request) {
    try {
      return route.handler(request);
    } catch (const std::exception& e) {
      return {500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what() + "\n"};
    }
  }

  void respond(Response r, bool keep_alive) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->version(11);
    res->result(static_cast<unsigned>(r.status));
    res->reason(reason_of(r.status));
    res->set(bhttp::field::content_type, r.content_type);
    res->set(bhttp::field::cache_control, "no-store");
    res->set("X-Content-Type-Options", "nosniff");
    for (const auto& [name, value] : r.headers)
      res->set(name, value);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive);
    res->prepare_payload();
    stream_.expires_after(server_.options.header_timeout);
    bhttp::async_write(
        stream_, *res,
        [self = shared_from_this(), res, keep_alive](beast::error_code ec, std::size_t) {
          if (ec || !keep_alive) {
            self->close();
            return;
          }
          self->read();
        });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  Server::Impl& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string remote_;
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept(io, [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      if (++connections > options.max_connections) {
        --connections;
        beast::error_code ignored;
        socket.close(ignored);  // over the limit: refused at once
      } else {
        std::make_shared<Session>(std::move(socket), *this)->read();
      }
    }
    accept();
  });
}

Server::Server(ServerOptions options, std::vector<Route> routes) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  impl_->routes = std::move(routes);
  const auto& listen = impl_->options.listen;
  const auto colon = listen.rfind(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("not host:port");
    auto host = listen.substr(0, colon);
    if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (host == "localhost") host = "127.0.0.1";
    const auto port = static_cast<unsigned short>(std::stoi(listen.substr(colon + 1)));
    const tcp::endpoint endpoint(net::ip::make_address(host.empty() ? "0.0.0.0" : host), port);
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(net::socket_base::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen(net::socket_base::max_listen_connections);
    const auto bound = impl_->acceptor.local_endpoint();
    impl_->address = (bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                              : bound.address().to_string()) +
                     ":" + std::to_string(bound.port());
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve on " + listen + " (" + e.what() +
                             "); choose a free host:port (port 0 picks one)");
  }
  impl_->workers =
      std::make_unique<net::thread_pool>(static_cast<std::size_t>(impl_->options.worker_threads));
  impl_->accept();
  impl_->io_thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

Server::~Server() {
  net::post(impl_->io, [impl = impl_.get()] {
    beast::error_code e;
    impl->acceptor.close(e);
  });
  impl_->io.stop();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
  // Handlers on the pool finish (the console's queries have a statement timeout); what they post
  // back to the stopped I/O context is destroyed with it.
  impl_->workers->join();
}

std::string Server::address() const {
  return impl_->address;
}

}  // namespace baton::detail::http
