// The console's server: who may ask (token, loopback host names), cross-site protection, the
// connection pool, the caches that pace its queries, and the routes (see console.h).
#include "console/console.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <optional>
#include <random>
#include <unordered_map>
#include <variant>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio/ip/address.hpp>

#include "baton/config.h"
#include "baton/detail/http_server.h"
#include "baton/detail/text.h"
#include "console/api.h"
#include "console/assets.h"

namespace baton::console {
namespace {

using detail::http::Request;
using detail::http::Response;

// How long a read is reused, so that many open pages cost the database no more than one: the
// queue depth is one scan of the live queue, paced like the leader's depth sampler.
constexpr std::chrono::milliseconds kClusterTtl{1000};
constexpr std::chrono::milliseconds kQueuesTtl{5000};
constexpr std::chrono::milliseconds kSeriesTtl{15000};
constexpr std::chrono::milliseconds kSearchTtl{1000};
constexpr std::size_t kCacheEntries = 256;
constexpr std::size_t kIdleConnections = 2;

// The page may run only its own script and style, and no page may frame it.
constexpr const char* kCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

std::string random_hex(std::size_t bytes) {
  std::random_device device;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>(device()) & 0xffU;
    out += kHex[b >> 4U];
    out += kHex[b & 0xfU];
  }
  return out;
}

// Compares without stopping at the first difference, so the time taken says nothing of the
// token.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0U : 1U;
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const auto x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0U;
    const auto y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0U;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::string header(const Request& r, const std::string& name) {
  const auto it = r.headers.find(name);
  return it == r.headers.end() ? "" : it->second;
}

// The host name of a Host header, without the port: "[v6]" or a name or IPv4 address, then
// nothing or ":port". Anything else is returned whole (and is no loopback name).
std::string host_part(std::string_view authority) {
  const auto end = !authority.empty() && authority.front() == '[' ? authority.find(']') + 1
                                                                  : authority.find(':');
  if (end == 0 || end == std::string_view::npos) return std::string(authority);
  const auto rest = authority.substr(end);
  if (!rest.empty() && rest.front() != ':') return std::string(authority);
  return std::string(authority.substr(0, end));
}

// "localhost", or an address literal that is loopback. A name that merely starts with "127." is
// anyone's (127.0.0.1.rebind.example): DNS decides where it points.
bool loopback_name(std::string host) {
  if (host == "localhost") return true;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

// An action for the log: its known fields only, each on one line and short.
std::string describe(const Json& request) {
  std::string out;
  for (const char* field : {"action", "queue", "node"}) {
    if (request.is_object() && request.contains(field)) {
      const auto& v = request[field];
      out += std::string(out.empty() ? "" : " ") + field + "=" +
             detail::one_line(v.is_string() ? v.get<std::string>() : v.dump(), 80);
    }
  }
  if (request.is_object() && request.contains("ids") && request["ids"].is_array()) {
    out += " ids=" + std::to_string(request["ids"].size());
  }
  return out.empty() ? "(no action)" : out;
}

Response json(int status, const Json& body) {
  return Response{status, "application/json; charset=utf-8",
                  body.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

Response error(int status, const std::string& message) {
  return json(status, Json{{"error", message}});
}

}  // namespace

struct Console::Impl {
  ConsoleConfig config;
  std::string csrf = random_hex(32);

  std::mutex pool_mutex;
  std::vector<std::unique_ptr<pqxx::connection>> idle;

  struct Cached {
    std::chrono::steady_clock::time_point until;
    Response response;
  };
  std::mutex cache_mutex;
  std::unordered_map<std::string, Cached> cache;
  std::atomic<std::uint64_t> generation{0};  // moves on with every action
  // One refresh of a paced read at a time: the others wait and take its result.
  std::mutex cluster_refresh, queues_refresh, series_refresh, schedules_refresh;
  Series series;

  std::unique_ptr<detail::http::Server> server;

  // A connection of the pool, returned to it when the request went well.
  std::unique_ptr<pqxx::connection> take() {
    {
      std::lock_guard lock(pool_mutex);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        if (c->is_open()) return c;
      }
    }
    return detail::connect(config.connect);
  }
  void give_back(std::unique_ptr<pqxx::connection> c) {
    std::lock_guard lock(pool_mutex);
    if (idle.size() < kIdleConnections && c->is_open()) idle.push_back(std::move(c));
  }

  template <class Read>
  Response read(Read&& what) {
    auto conn = take();
    Json body;
    {
      pqxx::read_transaction tx(*conn);
      body = what(tx);
    }
    give_back(std::move(conn));
    return json(200, body);
  }

  // A read reused for `ttl`; `refresh` lets one request at a time query for it. Results of
  // reads that began before an action are not kept (the generation moved on).
  template <class Read>
  Response cached(const std::string& key, std::chrono::milliseconds ttl, std::mutex* refresh,
                  Read&& what) {
    auto fresh = [&]() -> std::optional<Response> {
      std::lock_guard lock(cache_mutex);
      const auto it = cache.find(key);
      if (it != cache.end() && it->second.until > std::chrono::steady_clock::now()) {
        return it->second.response;
      }
      return std::nullopt;
    };
    if (auto r = fresh()) return *r;
    std::unique_lock<std::mutex> one;
    if (refresh != nullptr) {
      one = std::unique_lock(*refresh);
      if (auto r = fresh()) return *r;
    }
    const auto began = generation.load();
    auto response = read(std::forward<Read>(what));
    std::lock_guard lock(cache_mutex);
    if (generation.load() != began) return response;
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(cache, [now](const auto& entry) { return entry.second.until <= now; });
    if (cache.size() < kCacheEntries) cache[key] = {now + ttl, response};
    return response;
  }

  void forget() {
    std::lock_guard lock(cache_mutex);
    ++generation;
    cache.clear();
  }

  // Who is asking, or the refusal. Without a token only loopback host names are answered, so
  // that a web page whose name resolves to 127.0.0.1 (DNS rebinding) cannot reach the console
  // through its reader's browser.
  std::variant<std::string, Response> who(const Request& r) const {
    if (config.token.empty()) {
      const auto host = host_part(header(r, "host"));
      if (!loopback_name(host)) {
        return error(403,
                     "this console answers only to a loopback name (localhost, 127.0.0.1, "
                     "[::1]), not '" +
                         detail::one_line(host, 100) +
                         "'; give the node --console-token-file to reach it by other names");
      }
      return std::string("console@") + r.remote;
    }
    const auto auth = header(r, "authorization");
    std::string user = "token", secret;
    if (auth.rfind("Bearer ", 0) == 0) {
      secret = auth.substr(7);
    } else if (auth.rfind("Basic ", 0) == 0) {
      const auto decoded = detail::base64_decode(auth.substr(6));
      const auto colon = decoded.find(':');
      if (colon != std::string::npos) {
        user = decoded.substr(0, colon);
        secret = decoded.substr(colon + 1);
      }
    }
    if (secret.empty() || !same_secret(secret, config.token)) {
      Response denied = error(401,
                              "the console needs its token: basic auth with any user name "
                              "and the token as password, or Authorization: Bearer <token>");
      denied.headers.emplace_back("WWW-Authenticate",
                                  R"(Basic realm="baton console", charset="UTF-8")");
      return denied;
    }
    std::string name;
    for (const char c : user.substr(0, 64)) {
      const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' || c == '@';
      name += plain ? c : '_';
    }
    return name.empty() ? std::string("token") : name;
  }

  // A state-changing request must come from the console's own page: JSON (which a cross-site
  // form cannot send), the page's CSRF token in a header (which a cross-site script cannot set
  // without a preflight this server never grants), and, when the browser says, the same origin.
  std::string cross_site(const Request& r) const {
    if (header(r, "content-type").rfind("application/json", 0) != 0) {
      return "an action is a JSON request (Content-Type: application/json)";
    }
    if (!same_secret(header(r, "x-baton-csrf"), csrf)) {
      return "the request lacks this page's CSRF token (X-Baton-Csrf); reload the page";
    }
    const auto origin = header(r, "origin");
    if (!origin.empty()) {
      const auto scheme_end = origin.find("://");
      const auto authority =
          scheme_end == std::string::npos ? std::string() : origin.substr(scheme_end + 3);
      if (authority != header(r, "host")) return "the request comes from another origin";
    }
    const auto site = header(r, "sec-fetch-site");
    if (!site.empty() && site != "same-origin" && site != "none") {
      return "the request comes from another site";
    }
    return "";
  }

  Response api(const Request& r, const std::string& actor) {
    const auto& path = r.path;
    if (r.method == "POST" && path == "/api/action") {
      if (config.read_only) return error(403, "this console is read-only (--console-read-only)");
      if (const auto why = cross_site(r); !why.empty()) return error(403, why);
      const auto request = Json::parse(r.body, nullptr, false);
      if (request.is_discarded()) return error(400, "the request body is not JSON");
      const auto what = describe(request);
      try {
        auto conn = take();
        const auto result = act(*conn, config.connect.schema, "console:" + actor, request);
        give_back(std::move(conn));
        forget();
        spdlog::info("console: {} ({}) {}: {}", actor, r.remote, what,
                     detail::one_line(result.value("message", ""), 300));
        return json(200, result);
      } catch (const ApiError& e) {
        spdlog::warn("console: {} ({}) {}: refused: {}", actor, r.remote, what,
                     detail::one_line(e.message, 300));
        throw;
      }
    }
    if (path == "/api/action") return error(405, "an action is a POST");
    if (r.method != "GET") return error(405, "use GET (actions are POST /api/action)");
    if (path == "/api/session") {
      return json(200, Json{{"node", config.node_id},
                            {"version", config.version},
                            {"schema", config.connect.schema},
                            {"read_only", config.read_only},
                            {"actor", actor},
                            {"csrf", csrf}});
    }
    // The key holds only the parameters the endpoint reads, so that made-up ones cannot fill
    // the cache with copies.
    auto key_of = [&r, &path](std::initializer_list<const char*> names) {
      std::string key = path;
      for (const char* name : names) {
        const auto it = r.query.find(name);
        key += '\n';
        if (it != r.query.end()) key += it->second.substr(0, 200);
      }
      return key;
    };
    const std::string key = key_of({});
    if (path == "/api/cluster") {
      return cached(key, kClusterTtl, &cluster_refresh, [](auto& tx) { return cluster(tx); });
    }
    if (path == "/api/queues") {
      return cached(key, kQueuesTtl, &queues_refresh, [](auto& tx) { return queues(tx); });
    }
    if (path == "/api/series") {
      return cached(key, kSeriesTtl, &series_refresh, [this](auto& tx) { return series.read(tx); });
    }
    if (path == "/api/schedules") {
      return cached(key, kClusterTtl, &schedules_refresh, [](auto& tx) { return schedules(tx); });
    }
    // Searches are cached briefly (their rows and texts are bounded); one job or saga, whose
    // payload or state may be large, is read each time.
    if (path == "/api/jobs") {
      return cached(key_of({"id", "queue", "type", "state", "key"}), kSearchTtl, nullptr,
                    [&r](auto& tx) { return jobs(tx, r.query); });
    }
    if (path == "/api/dead") {
      return cached(key_of({"queue"}), kSearchTtl, nullptr,
                    [&r](auto& tx) { return dead(tx, r.query); });
    }
    if (path == "/api/job") return read([&r](auto& tx) { return job(tx, r.query); });
    if (path == "/api/sagas") return read([&r](auto& tx) { return sagas(tx, r.query); });
    return error(404, "no such endpoint: " + detail::one_line(path, 100));
  }

  Response serve(const Request& r) {
    auto asked = who(r);
    Response out;
    if (auto* refused = std::get_if<Response>(&asked)) {
      out = std::move(*refused);
    } else if (r.path.rfind("/api/", 0) == 0) {
      const auto& actor = std::get<std::string>(asked);
      try {
        out = api(r, actor);
      } catch (const ApiError& e) {
        out = error(e.status, e.message);
      } catch (const pqxx::broken_connection& e) {
        out = error(503, "the database does not answer (" +
                             detail::one_line(detail::scrub(e.what()), 300) + ")");
      } catch (const pqxx::sql_error& e) {
        // A statement timeout is the database not answering in time; anything else is ours.
        const bool slow = e.sqlstate() == "57014";
        out = error(slow ? 503 : 500,
                    (slow ? "the database did not answer within the console's statement "
                            "timeout (5 s): "
                          : "database: ") +
                        detail::one_line(detail::server_message(e), 300));
      } catch (const std::exception& e) {
        out = error(500, detail::one_line(detail::scrub(e.what()), 300));
      }
    } else if (r.method != "GET") {
      out = error(405, "use GET");
    } else if (const auto* asset = find_asset(r.path == "/" ? "/index.html" : r.path)) {
      out = Response{200, std::string(asset->content_type), std::string(asset->body)};
    } else {
      out = Response{404, "text/plain; charset=utf-8", "not found\n"};
    }
    if (config.observe) {
      const bool api_path = r.path.rfind("/api/", 0) == 0;
      config.observe(!api_path ? "page" : r.method == "POST" ? "action" : "read", out.status);
    }
    out.headers.emplace_back("Content-Security-Policy", kCsp);
    out.headers.emplace_back("X-Frame-Options", "DENY");
    out.headers.emplace_back("Referrer-Policy", "no-referrer");
    out.headers.emplace_back("Cross-Origin-Resource-Policy", "same-origin");
    return out;
  }
};

Console::Console(ConsoleConfig config) : impl_(std::make_shared<Impl>()) {
  impl_->config = std::move(config);
  detail::http::ServerOptions options{.listen = impl_->config.listen,
                                      .worker_threads = impl_->config.worker_threads};
  try {
    impl_->server = std::make_unique<detail::http::Server>(
        options, std::vector<detail::http::Route>{
                     {"/", [impl = impl_.get()](const Request& r) { return impl->serve(r); }},
                 });  // "/" with its trailing slash: every path
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("console-listen: ") + e.what() + ", or off");
  }
}

Console::~Console() {
  impl_->server.reset();
}

std::string Console::address() const {
  return impl_->server->address();
}

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError("console-token-file: cannot read " + path +
                      " (missing, or not readable by this user)");
  }
  std::string token;
  std::getline(in, token);
  const auto first = token.find_first_not_of(" \t\r");
  const auto last = token.find_last_not_of(" \t\r");
  token = first == std::string::npos ? "" : token.substr(first, last - first + 1);
  if (token.size() < 16) {
    throw ConfigError("console-token-file: the token in " + path +
                      " is shorter than 16 characters; make one with "
                      "`head -c 24 /dev/urandom | base64 > " +
                      path + "`");
  }
  return token;
}

}  // namespace baton::console
