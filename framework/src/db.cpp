// Connections: every one carries the node's application_name, short keepalives and search_path.
#include "baton/detail/db.h"

#include <libpq-fe.h>

#include <cstdio>
#include <sstream>

#include "baton/config.h"

namespace baton::detail {
namespace {

// Quotes a value for a key=value connection string.
std::string conninfo_value(std::string_view v) {
  std::string out = "'";
  for (char c : v) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

// Rebuilds any libpq form (URI or key=value) as key=value, with our settings on top, so that
// keepalives and application_name apply whatever form the operator used.
std::string build_conninfo(const ConnectOptions& o) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(o.url.c_str(), &err);
  if (opts == nullptr) {
    std::string message = err != nullptr ? err : "unparsable";
    PQfreemem(err);
    throw ConfigError("database-url: libpq cannot parse it: " + message);
  }
  std::string out;
  auto add = [&out](std::string_view key, std::string_view value) {
    out += std::string(key) + "=" + conninfo_value(value) + " ";
  };
  static const char* ours[] = {"application_name", "keepalives", "keepalives_idle",
                               "keepalives_interval", "keepalives_count"};
  bool has_connect_timeout = false;
  for (auto* p = opts; p->keyword != nullptr; ++p) {
    if (p->val == nullptr) continue;
    const std::string_view key = p->keyword;
    bool overridden = false;
    for (const char* k : ours)
      overridden = overridden || key == k;
    has_connect_timeout = has_connect_timeout || key == "connect_timeout";
    if (!overridden) add(key, p->val);
  }
  PQconninfoFree(opts);
  if (!o.application_name.empty()) add("application_name", o.application_name);
  add("keepalives", "1");
  add("keepalives_idle", "2");
  add("keepalives_interval", "1");
  add("keepalives_count", "3");
  if (!has_connect_timeout) add("connect_timeout", "5");
  return out;
}

}  // namespace

void validate_schema_name(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 63 && !(name[0] >= '0' && name[0] <= '9');
  for (char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  if (!ok) {
    throw ConfigError("schema: '" + std::string(name) +
                      "' is not allowed; use 1..63 of a-z, 0-9 and _, not starting with a digit");
  }
}

std::unique_ptr<pqxx::connection> connect(const ConnectOptions& o) {
  validate_schema_name(o.schema);
  auto conn = std::make_unique<pqxx::connection>(build_conninfo(o));
  pqxx::nontransaction tx(*conn);
  std::string set = "SET search_path TO " + tx.quote_name(o.schema);
  tx.exec(set);
  if (o.statement_timeout_ms > 0) {
    tx.exec("SET statement_timeout = " + std::to_string(o.statement_timeout_ms));
  }
  if (o.idle_session_timeout_ms > 0) {
    tx.exec("SET idle_session_timeout = " + std::to_string(o.idle_session_timeout_ms));
  }
  return conn;
}

std::string with_schema(std::string_view sql, std::string_view schema) {
  validate_schema_name(schema);  // [a-z_][a-z0-9_]*: the quotes are belt and braces
  const std::string quoted = "\"" + std::string(schema) + "\"";
  std::string out;
  out.reserve(sql.size() + 4 * quoted.size());
  for (char c : sql) {
    if (c == '@') {
      out += quoted;
    } else {
      out += c;
    }
  }
  return out;
}

std::string int_array(const std::vector<std::int64_t>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out + "}";
}

std::string double_array(const std::vector<double>& values) {
  std::string out = "{";
  char buf[32];
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    std::snprintf(buf, sizeof buf, "%.9g", values[i]);
    out += buf;
  }
  return out + "}";
}

std::string scrub(std::string message) {
  for (std::size_t at = message.find("password="); at != std::string::npos;
       at = message.find("password=", at + 1)) {
    const auto value = at + 9;
    std::size_t end = std::string::npos;
    if (value < message.size() && (message[value] == '\'' || message[value] == '"')) {
      end = message.find(message[value], value + 1);  // a quoted value, quotes included
      if (end != std::string::npos) ++end;
    } else {
      end = message.find_first_of(" \t\r\n&'\"", value);
    }
    if (end == std::string::npos) end = message.size();
    message.replace(value, end - value, "********");
  }
  return message;
}

bool is_connection_error(const std::exception& e) {
  if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr) return true;
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    const std::string& state = sql->sqlstate();
    // Class 08: connection exceptions; 57P01..57P03: admin shutdown, crash, cannot connect now.
    return state.rfind("08", 0) == 0 || state == "57P01" || state == "57P02" || state == "57P03";
  }
  return false;
}

}  // namespace baton::detail
