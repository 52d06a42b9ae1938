// Validation of NodeConfig and the parsers shared by batond, batonctl and the TOML loader.
#include "baton/config.h"

#include <libpq-fe.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "baton/client.h"
#include "baton/detail/db.h"
#include "baton/detail/text.h"

namespace baton {
namespace {

// A connection-string value as it may appear in a log. A value with blanks or '=' is hidden:
// libpq takes "postgresql:// password=x" (two forms mixed) as a host named " password=x".
std::string shown(std::string_view value) {
  if (value.find_first_of(" \t\r\n=") != std::string_view::npos || value.size() > 255) {
    return "(hidden: unusual value)";
  }
  return std::string(value);
}

[[noreturn]] void fail(std::string_view setting, const std::string& message) {
  throw ConfigError(std::string(setting) + ": " + message);
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "localhost";
  return buf.data();
}

void require_positive(std::string_view setting, Millis value) {
  if (value.count() <= 0) {
    fail(setting, "must be a positive duration such as 200ms or 2s, got " +
                      std::to_string(value.count()) + "ms");
  }
}

}  // namespace

Millis parse_duration(std::string_view text, std::string_view setting) {
  const std::string form = " (use a number with a unit: 250ms, 2s, 1.5s, 3m, 1h)";
  std::size_t unit_at = 0;
  while (unit_at < text.size() &&
         ((text[unit_at] >= '0' && text[unit_at] <= '9') || text[unit_at] == '.')) {
    ++unit_at;
  }
  if (unit_at == 0) {
    fail(setting, detail::concat("'", text, "' is not a duration", form));
  }
  double number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + unit_at, number);
  if (ec != std::errc{} || end != text.data() + unit_at || !std::isfinite(number)) {
    fail(setting, detail::concat("'", text, "' is not a duration", form));
  }
  const std::string_view unit = text.substr(unit_at);
  double ms = 0;
  if (unit == "ms") {
    ms = number;
  } else if (unit == "s") {
    ms = number * 1000;
  } else if (unit == "m") {
    ms = number * 60'000;
  } else if (unit == "h") {
    ms = number * 3'600'000;
  } else if (unit.empty()) {
    fail(setting, detail::concat("'", text, "' has no unit", form));
  } else {
    fail(setting, detail::concat("'", text, "' has an unknown unit '", unit, "'", form));
  }
  if (ms > 1e12) fail(setting, detail::concat("'", text, "' is too long", form));
  return Millis(static_cast<std::int64_t>(std::llround(ms)));
}

Millis NodeConfig::local_lease() const {
  // 1 % for the rates of the two clocks (the leader's steady clock, the database's), which
  // agree far better than that on one host and on NTP-disciplined ones.
  return Millis(lock_ttl.count() * 99 / 100) - lease_margin;
}

std::string describe_database_url(const std::string& url) {
  char* err = nullptr;
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> opts(
      PQconninfoParse(url.c_str(), &err), &PQconninfoFree);
  if (!opts) {
    const std::string message = detail::one_line(err != nullptr ? err : "unparsable");
    PQfreemem(err);
    throw ConfigError("database-url: libpq cannot parse it (" + message +
                      "); use postgresql://user@host:port/dbname or 'host=... dbname=...'");
  }
  std::string out;
  for (const char* key : {"host", "hostaddr", "port", "dbname", "user", "sslmode"}) {
    for (auto* o = opts.get(); o->keyword != nullptr; ++o) {
      if (std::string_view(o->keyword) == key && o->val != nullptr && *o->val != '\0') {
        if (!out.empty()) out += ' ';
        out += std::string(key) + "=" + shown(o->val);
      }
    }
  }
  return out.empty() ? "(libpq defaults)" : out;
}

std::string redact_database_url(const std::string& url) {
  constexpr const char* kHidden = "********";
  std::string out = url;
  const bool uri = out.rfind("postgresql://", 0) == 0 || out.rfind("postgres://", 0) == 0;
  if (uri) {
    // postgresql://user:password@host/db?password=...
    const auto start = out.find("://") + 3;
    const auto end = out.find_first_of("/?", start);
    const auto authority =
        out.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const auto at = authority.rfind('@');
    if (at != std::string::npos) {
      const auto colon = authority.find(':');
      if (colon != std::string::npos && colon < at) {
        out.replace(start + colon + 1, at - colon - 1, kHidden);
      }
    }
    for (std::size_t p = out.find("password=", 0); p != std::string::npos;
         p = out.find("password=", p + 1)) {
      const auto value = p + 9;
      const auto stop = out.find('&', value);
      out.replace(value, stop == std::string::npos ? std::string::npos : stop - value, kHidden);
    }
    return out;
  }
  // key=value form: rebuild it from libpq's own parse, with the password hidden.
  char* err = nullptr;
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> opts(
      PQconninfoParse(url.c_str(), &err), &PQconninfoFree);
  if (!opts) {
    PQfreemem(err);
    return "(unparsable connection string)";
  }
  out.clear();
  for (auto* o = opts.get(); o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    if (!out.empty()) out += ' ';
    out += std::string(o->keyword) + "=" +
           (std::string_view(o->keyword) == "password" ? std::string(kHidden) : shown(o->val));
  }
  return out;
}

namespace {

bool is_host_port(const std::string& listen) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const auto port_text = std::string_view(listen).substr(colon + 1);
  int port = -1;
  const auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  return ec == std::errc{} && p == port_text.data() + port_text.size() && port >= 0 &&
         port <= 65535;
}

bool is_loopback(const std::string& listen) {
  const auto host = listen.substr(0, listen.rfind(':'));
  return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

void NodeConfig::validate() {
  if (database_url.empty()) {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): a node is configured before its threads start
    if (const char* url = std::getenv("DATABASE_URL"); url != nullptr) database_url = url;
  }
  if (database_url.empty()) {
    fail("database-url", "is required; pass --database-url or set DATABASE_URL");
  }
  describe_database_url(database_url);
  detail::validate_schema_name(schema);
  if (!cluster.empty()) {
    try {
      detail::validate_name("cluster", cluster);
    } catch (const EnqueueError& e) {
      fail("cluster", e.what());
    }
  }
  // Sessions are named "<node id>@<schema>", and PostgreSQL keeps 63 bytes of a name.
  const std::size_t room = 63 - 1 - schema.size();
  if (node_id.empty()) {
    const std::string pid = detail::concat(":", std::to_string(getpid()));
    node_id = host_name().substr(0, room > pid.size() ? room - pid.size() : 0) + pid;
  }
  if (node_id.size() > room) {
    fail("node-id", "'" + node_id +
                        "' is too long: node-id and schema together must fit in 62 characters "
                        "(sessions are named <node-id>@<schema>); shorten either");
  }
  for (char c : node_id) {
    if (c < 0x21 || c > 0x7e) fail("node-id", "must be printable ASCII without spaces");
  }
  if (threads < 1 || threads > 1024) fail("threads", "must be between 1 and 1024");
  if (batch_size < 1 || batch_size > 10000) fail("batch-size", "must be between 1 and 10000");
  if (shards < 1 || shards > 64) {
    fail("shards", std::to_string(shards) + " is out of range; use 1..64 (1: one leader)");
  }
  for (const auto& q : queues) {
    try {
      detail::validate_name("queue", q);
    } catch (const EnqueueError& e) {
      fail("queues", e.what());
    }
  }
  if (metrics_listen != "off" && !is_host_port(metrics_listen)) {
    fail("metrics-listen",
         "'" + metrics_listen + "' is not host:port (e.g. 127.0.0.1:9464, port 0 for any), or off");
  }
  if (console_listen != "off") {
    if (!is_host_port(console_listen)) {
      fail("console-listen",
           "'" + console_listen +
               "' is not host:port (e.g. 127.0.0.1:8080, port 0 for any), or off");
    }
    if (console_token_file.empty() && !is_loopback(console_listen)) {
      fail("console-listen",
           "'" + console_listen +
               "' is beyond loopback, and the console has no token: give --console-token-file "
               "(docs/console.md), or listen on 127.0.0.1");
    }
  }
  if (!console_database_url.empty()) describe_database_url(console_database_url);
  for (const auto& [queue, limit] : queue_concurrency) {
    try {
      detail::validate_name("queue", queue);
    } catch (const EnqueueError& e) {
      fail("queue-concurrency", e.what());
    }
    if (limit < 1 || limit > threads) {
      fail("queue-concurrency", "limit of queue '" + queue + "' is " + std::to_string(limit) +
                                    "; use 1..threads (" + std::to_string(threads) + ")");
    }
  }
  require_positive("poll-interval", poll_interval);
  if (claim_gather.count() < 0 || claim_gather > Millis(100)) {
    fail("claim-gather", "must be 0ms..100ms (0ms: claim again at once), got " +
                             std::to_string(claim_gather.count()) + "ms");
  }
  require_positive("history-retention", history_retention);
  require_positive("lock-ttl", lock_ttl);
  require_positive("renew-interval", renew_interval);
  require_positive("retry-interval", retry_interval);
  require_positive("retry-base", retry_base);
  require_positive("retry-cap", retry_cap);
  if (shutdown_grace.count() < 0) fail("shutdown-grace", "must not be negative");
  if (lock_ttl < Millis(100)) fail("lock-ttl", "must be at least 100ms");
  // The lease ordering (docs/concepts.md): the leader's own lease must end, with a margin, before
  // the database can let anyone else lead, and leave room for two failed renewals.
  if (lease_margin < Millis(10)) {
    fail("lease-margin", "must be at least 10ms: it absorbs a thread woken late");
  }
  const auto own = local_lease();
  const std::string lease_text = "the leader's own lease (lock-ttl " +
                                 std::to_string(lock_ttl.count()) + "ms x 0.99 - lease-margin " +
                                 std::to_string(lease_margin.count()) +
                                 "ms = " + std::to_string(own.count()) + "ms)";
  if (own < Millis(30)) {
    fail("lease-margin", lease_text +
                             " must be at least 30ms: raise lock-ttl or lower "
                             "lease-margin");
  }
  if (renew_interval * 3 > own) {
    fail("renew-interval",
         std::to_string(renew_interval.count()) + "ms is more than a third of " + lease_text +
             ", so two failed renewals would end leadership; use renew-interval <= " +
             std::to_string(own.count() / 3) + "ms or a longer lock-ttl");
  }
  if (retry_interval > lock_ttl) fail("retry-interval", "must not exceed lock-ttl");
  if (retry_cap < retry_base) fail("retry-cap", "must be at least retry-base");
  if (!election_database_url.empty()) describe_database_url(election_database_url);
  // Jobs name the lock group that claimed them "<region>/<lock_key>": the naming rule (no '/')
  // keeps that unambiguous.
  for (const auto& [setting, value] : {std::pair{"lock-key", &lock_key}, {"region", &region}}) {
    try {
      detail::validate_name(setting, *value);
    } catch (const EnqueueError& e) {
      fail(setting, e.what());
    }
  }
}

}  // namespace baton
