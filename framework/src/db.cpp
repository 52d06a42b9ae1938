// Connections: every one carries the node's application_name, short keepalives and search_path.
#include "baton/detail/db.h"

#include <libpq-fe.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "baton/config.h"
#include "baton/detail/call_watch.h"
#include "baton/detail/text.h"

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
  bool has_connect_timeout = false, has_user_timeout = false;
  for (auto* p = opts; p->keyword != nullptr; ++p) {
    if (p->val == nullptr) continue;
    const std::string_view key = p->keyword;
    bool overridden = false;
    for (const char* k : ours)
      overridden = overridden || key == k;
    has_connect_timeout = has_connect_timeout || key == "connect_timeout";
    has_user_timeout = has_user_timeout || key == "tcp_user_timeout";
    if (!overridden) add(key, p->val);
  }
  PQconninfoFree(opts);
  if (!o.application_name.empty()) add("application_name", o.application_name);
  // Client-side bounds: a dead peer is found by keepalives when idle, and sent data that is
  // never acknowledged fails the connection after tcp_user_timeout. Each call also has a
  // deadline of its own (detail/call_watch.h): a peer that acknowledges but never answers.
  add("keepalives", "1");
  add("keepalives_idle", "2");
  add("keepalives_interval", "1");
  add("keepalives_count", "3");
  if (!has_user_timeout) add("tcp_user_timeout", "10000");
  if (!has_connect_timeout) add("connect_timeout", "2");  // libpq's least
  return out;
}

// Connection attempts that a stopping component abandoned go on, on threads of their own. A
// process that exits meanwhile waits for them (up to 5 s): one still inside libpqxx would read
// libpqxx's static data while exit destroys it. The count itself is never destroyed, for a
// thread that outlasts the wait.
struct Attempts {
  std::mutex mutex;
  std::condition_variable cv;
  int running = 0;
};
Attempts& attempts() {
  static auto* const all = new Attempts();
  return *all;
}
void count_attempt(int change) {
  auto& all = attempts();
  {
    std::lock_guard lock(all.mutex);
    all.running += change;
  }
  all.cv.notify_all();
}
// The wait. Statics are destroyed in the reverse order of their construction, so it is
// constructed once a connection has run a statement, which builds libpqxx's static data.
struct WaitForAttemptsAtExit {
  WaitForAttemptsAtExit() = default;
  WaitForAttemptsAtExit(const WaitForAttemptsAtExit&) = delete;
  WaitForAttemptsAtExit& operator=(const WaitForAttemptsAtExit&) = delete;
  ~WaitForAttemptsAtExit() {
    auto& all = attempts();
    std::unique_lock lock(all.mutex);
    all.cv.wait_for(lock, std::chrono::seconds(5), [&] { return all.running == 0; });
  }
};

}  // namespace

void validate_schema_name(std::string_view name) {
  // kMaxSchemaName (db.h): pg_notify refuses a longer channel, so enqueue would fail while a
  // leader sleeps.
  bool ok = !name.empty() && name.size() <= kMaxSchemaName && !(name[0] >= '0' && name[0] <= '9');
  for (char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  if (!ok) {
    throw ConfigError("schema: '" + std::string(name) + "' is not allowed; use 1.." +
                      std::to_string(kMaxSchemaName) +
                      " of a-z, 0-9 and _, not starting with a digit");
  }
}

std::string session_statement(pqxx::connection& conn, const ConnectOptions& o) {
  if (!o.session_settings) return "";
  validate_schema_name(o.schema);
  // One round trip for every setting.
  std::string set = "SET search_path TO " + conn.quote_name(o.schema);
  auto add = [&set](const char* name, long long value) {
    if (value > 0) set += std::string("; SET ") + name + " = " + std::to_string(value);
  };
  add("statement_timeout", o.statement_timeout_ms);
  add("idle_session_timeout", o.idle_session_timeout_ms);
  add("idle_in_transaction_session_timeout", o.idle_in_transaction_timeout_ms);
  add("lock_timeout", o.lock_timeout_ms);
  // A call the call watch cuts (its socket shut down) also ends on the server within a second,
  // instead of when its statement next writes to the client: a cut claim scanning a large
  // backlog ran on for as long as its scan took, and claims cut one after another piled up on
  // the server until the leader's renewal missed its lease (seen in a 5M-job drain).
  add("client_connection_check_interval", 1000);
  if (o.synchronous_commit_off) set += "; SET synchronous_commit = off";
  // A claim's update (by address) and a completion (by id) planned on a table of a few pages
  // read the whole table instead, every time: 4,000-7,600 buffers a call once 32 producers had
  // queued 200k jobs behind a leader that started on an empty queue. Statements here that must
  // read a whole table still do (enable_seqscan only prices a sequential scan out).
  if (o.generic_plans) {
    set += "; SET plan_cache_mode = force_generic_plan; SET jit = off; SET enable_seqscan = off";
  }
  if (o.order_from_index) set += "; SET enable_sort = off";
  if (o.server_keepalive_ms > 0) {
    // The server finds a dead peer no sooner than idle + interval x count seconds; tcp 0 keeps
    // the system's (long) retransmission limit.
    const long long idle = std::max<long long>(1, (o.server_keepalive_ms + 999) / 1000);
    add("tcp_keepalives_idle", idle);
    add("tcp_keepalives_interval", 1);
    add("tcp_keepalives_count", 1);
    set += "; SET tcp_user_timeout = 0";
  }
  return set;
}

std::unique_ptr<pqxx::connection> connect(const ConnectOptions& o) {
  CallWatch::forget_last_call();
  validate_schema_name(o.schema);
  auto conn = std::make_unique<pqxx::connection>(build_conninfo(o));
  if (!o.session_settings) return conn;
  pqxx::nontransaction(*conn).exec(session_statement(*conn, o));
  // libpqxx would open a new session by itself on the next call after the server ended this one
  // (a restart, a failover, a terminated backend), without the settings above: in the default
  // search_path, where a role that may create objects there would be found first, and with no
  // timeouts. The call fails instead, and the connection's owner connects again through here.
  // (A connection without session settings, a Client's, names the schema in every statement
  // and may come back so.) Deprecated in libpqxx 6.4, which has no other way to say it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  conn->inhibit_reactivation(true);
#pragma GCC diagnostic pop
  return conn;
}

std::unique_ptr<pqxx::connection> connect(const ConnectOptions& options,
                                          std::uintptr_t abort_owner) {
  // libpq opens the socket inside the blocking call, so there is nothing for CallWatch to cut
  // until it returns: open it on a thread of its own and wait here, watching for the abort.
  struct Attempt {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::unique_ptr<pqxx::connection> conn;
    std::exception_ptr error;
  };
  CallWatch::forget_last_call();
  auto& watch = CallWatch::instance();
  if (watch.aborting(abort_owner)) {
    throw pqxx::broken_connection("not connecting: the component is stopping");
  }
  auto attempt = std::make_shared<Attempt>();
  count_attempt(1);
  try {
    std::thread([attempt, options]() mutable {
      std::unique_ptr<pqxx::connection> conn;
      std::exception_ptr error;
      try {
        conn = connect(options);
        static WaitForAttemptsAtExit wait_at_exit;
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(attempt->mutex);
        attempt->conn = std::move(conn);
        attempt->error = error;
        attempt->done = true;
        attempt->cv.notify_all();
      }
      // An abandoned attempt's connection closes here, before this thread stops counting.
      attempt.reset();
      count_attempt(-1);
    }).detach();
  } catch (...) {
    count_attempt(-1);  // no thread
    throw;
  }
  std::unique_lock lock(attempt->mutex);
  while (
      !attempt->cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return attempt->done; })) {
    if (watch.aborting(abort_owner)) {
      throw pqxx::broken_connection("connecting abandoned: the component is stopping");
    }
  }
  if (attempt->error) std::rethrow_exception(attempt->error);
  return std::move(attempt->conn);
}

std::string transaction_pooling(const ConnectOptions& options, std::uintptr_t abort_owner) {
  // A session holds a server connection for good; a transaction pooler lends one per
  // transaction. So: note a's server pid, let b hold a transaction open (which takes the server
  // connection a just gave back, if a pooler lends them), and ask a again. A session answers at
  // once on its own server connection; through a pooler a may get another one, or wait for b's
  // transaction to end when the pool has no other (so a's question has a deadline).
  auto probe = options;
  probe.session_settings = false;  // nothing may leak into a pool's server connections
  const auto owner = abort_owner != 0 ? abort_owner : owner_of(&probe);
  auto open = [&] { return abort_owner != 0 ? connect(probe, abort_owner) : connect(probe); };
  auto a = open();
  auto b = open();
  // Every question has a deadline: a network that stops answering fails the probe, not the node.
  constexpr std::chrono::seconds kDeadline{2};
  auto pid_of = [&](pqxx::connection& conn) {
    auto armed = CallWatch::instance().arm(conn, kDeadline, owner);
    pqxx::nontransaction tx(conn);
    return tx.exec("SELECT pg_backend_pid()")[0][0].as<int>();
  };
  const std::string advice =
      ". Session advisory locks, LISTEN and session settings do not survive it, so leadership "
      "would churn. Connect nodes directly or through a session-mode pool, or give "
      "--election-database-url a direct URL (producers and handlers may keep the pooler)";
  for (int round = 0; round < 3; ++round) {
    const int before = pid_of(*a);
    auto armed_b = CallWatch::instance().arm(*b, kDeadline, owner);
    pqxx::work holding(*b);
    holding.exec("SELECT pg_backend_pid()");
    int after = 0;
    try {
      after = pid_of(*a);
    } catch (const std::exception& e) {
      if (!is_connection_error(e) || CallWatch::instance().aborting(owner)) throw;
      return "database-url: this connection goes through a transaction pooler (PgBouncer "
             "pool_mode=transaction?): a query waited for another connection's transaction "
             "to end" +
             advice;
    }
    holding.commit();
    if (before != after) {
      return "database-url: this connection goes through a transaction pooler (PgBouncer "
             "pool_mode=transaction?): one connection ran on server sessions " +
             std::to_string(before) + " and " + std::to_string(after) + advice;
    }
  }
  return "";
}

std::string with_schema(std::string_view sql, std::string_view schema) {
  validate_schema_name(schema);  // [a-z_][a-z0-9_]*: the quotes are belt and braces
  const std::string quoted = concat("\"", schema, "\"");
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

void search_schema_only(pqxx::transaction_base& tx, std::string_view schema) {
  validate_schema_name(schema);
  tx.exec(concat("SET LOCAL search_path TO ", tx.quote_name(std::string(schema)), ", pg_temp"));
}

std::string int_array(const std::vector<std::int64_t>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out + "}";
}

std::string text_array(const std::vector<std::string>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
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

std::string server_message(const pqxx::sql_error& e) {
  // libpq's text is "ERROR:  message\nDETAIL:  ...\nHINT:  ...\nCONTEXT:  ...". The message may
  // hold newlines of its own (a name quoted in it), so sections are found by their markers.
  const std::string text = e.what();
  auto section = [&](const std::string& marker) -> std::string {
    const auto at = text.find(marker);
    if (at == std::string::npos) return "";
    const auto from = at + marker.size();
    auto to = text.size();
    for (const char* next : {"\nDETAIL:  ", "\nHINT:  ", "\nCONTEXT:  ", "\nQUERY:  ", "\nLINE "}) {
      const auto n = text.find(next, from);
      if (n != std::string::npos) to = std::min(to, n);
    }
    return one_line(std::string_view(text).substr(from, to - from));
  };
  std::string out = section("ERROR:  ");
  if (out.empty()) out = section("FATAL:  ");
  if (out.empty()) out = section("");
  for (const char* marker : {"\nDETAIL:  ", "\nHINT:  "}) {
    if (const auto more = section(marker); !more.empty()) out += " (" + more + ")";
  }
  return scrub(out);
}

bool is_authentication_error(const std::exception& e) {
  const std::string_view text = e.what();
  for (const char* sign :
       {"password authentication failed", "authentication failed for user", "no pg_hba.conf entry",
        "is not permitted to log in", "password is required", "SCRAM authentication"}) {
    if (text.find(sign) != std::string_view::npos) return true;
  }
  return false;
}

bool is_connection_error(const std::exception& e) {
  if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr) return true;
  // A COMMIT whose connection was lost before its answer came (libpqxx's word for it).
  if (dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr) return true;
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    const std::string& state = sql->sqlstate();
    // Class 08: connection exceptions; 57P01..57P03: admin shutdown, crash, cannot connect now.
    return state.rfind("08", 0) == 0 || state == "57P01" || state == "57P02" || state == "57P03";
  }
  return false;
}

}  // namespace baton::detail
