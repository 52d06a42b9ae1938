// Producers' side of the queue. Every enqueue is one statement that inserts the rows and, when a
// leader may be asleep on the queue, sends one NOTIFY for it (sql/0010_fast_enqueue.sql). The SQL
// names baton's schema explicitly, so it also runs inside a caller's transaction.
#include "baton/client.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/enqueue_counts.h"
#include "baton/detail/job_queries.h"

namespace baton {
namespace {

// Validation, defaults and the insert live in the SQL API (sql/0004_sql_api.sql): one definition
// for every producer, C++ or not.
constexpr const char* kEnqueueSql = "SELECT * FROM @.enqueue_many($1::jsonb)";
constexpr const char* kPreparedEnqueue = "baton_enqueue";
// The same for typed columns (sql/0010_fast_enqueue.sql), when the role may call it.
constexpr const char* kColumnsSql =
    "SELECT * FROM @.enqueue_columns($1::text[], $2::text[], $3::jsonb, $4::int[], $5::bigint[], "
    "$6::int[], $7::timestamptz[], $8::text[], $9::text[], $10::int[])";
constexpr const char* kPreparedColumns = "baton_enqueue_columns";
// One job, when the role may call enqueue (sql/0013_enqueue_constants.sql): for a single job it
// is much the cheaper call (32 producers at once: 2.03 x the jobs per second of enqueue_columns,
// docs/performance-log.md, "The C++ Client's single job"). $10: the delay in ms, for a job without
// run_at, as float8: pg_catalog has float8 * interval, but not bigint * interval, which would be
// looked up on the caller's search_path (see detail::search_schema_only).
constexpr const char* kOneSql =
    "SELECT @.enqueue($1, $2, $3::jsonb, $4::int, coalesce($5::timestamptz, now() + "
    "$10::pg_catalog.float8 * interval '1 millisecond'), $6::int, $7, $8, $9::int)";
constexpr const char* kPreparedOne = "baton_enqueue_one";
// $2: the function's name, $3: how many arguments the statement above passes it (enqueue has an
// overload of three, which every role may execute: sql/0021_enqueue_three_arguments.sql).
constexpr const char* kMayCallSql =
    "SELECT bool_and(has_function_privilege(p.oid, 'EXECUTE')) FROM pg_catalog.pg_proc p "
    "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = $1 AND p.proname = $2 AND p.pronargs = $3";
constexpr const char* kValidateSql = "SELECT @.validate_jobs($1::jsonb)";

constexpr const char* kExistingSql =
    "SELECT id FROM @.jobs WHERE queue = $1 AND idempotency_key = $2";

// $1 queue, $2 type, $3 payload, $4 priority, $5 delay ms, $6 max attempts, $7 timeout ms,
// $8 count, $9 channel. Copies spread over the shards as shard_of() maps jobs without a key
// (sql/0012_shards.sql), and it notifies a shard only when its leader may be asleep, as
// enqueue_many does (leader_busy's keys).
constexpr const char* kCopiesSql = R"sql(
WITH n AS (SELECT @.shard_count() AS shards),
ins AS (
  INSERT INTO @.jobs (queue, type, payload, priority, run_at, max_attempts, timeout_ms, shard)
  SELECT $1, $2, $3::jsonb, $4, now() + $5::pg_catalog.float8 * interval '1 millisecond', $6,
         nullif($7::int, 0), @.shard_of(NULL, n.shards)
    FROM generate_series(1, $8::int), n
  RETURNING id, shard),
wake AS (
  SELECT count(pg_notify($9, $1)) AS n
    FROM (SELECT DISTINCT CASE WHEN shard > 0 THEN '#' || shard ELSE '' END AS sfx FROM ins) d
   WHERE NOT (pg_try_advisory_xact_lock_shared(hashtextextended($9 || '/' || $1 || d.sfx, 0))
              AND pg_try_advisory_xact_lock_shared(hashtextextended($9 || '/*' || d.sfx, 0))))
SELECT id FROM ins WHERE (SELECT n FROM wake) >= 0 ORDER BY id
)sql";

// True when a string (or key) anywhere in `j` holds a NUL character.
bool has_nul(const nlohmann::json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().find('\0') != std::string::npos;
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (key.find('\0') != std::string::npos || has_nul(value)) return true;
    }
  }
  if (j.is_array()) {
    for (const auto& value : j) {
      if (has_nul(value)) return true;
    }
  }
  return false;
}

// Serialises the payload and applies this client's own size cap (the database applies its
// limit too). Names and options are checked by the SQL API.
void check(const NewJob& job, std::size_t max_payload, std::string* payload_text) {
  try {
    *payload_text = job.payload.dump();
  } catch (const nlohmann::json::exception& e) {
    throw EnqueueError(std::string("payload is not valid JSON text (") + e.what() +
                       "); strings must be UTF-8");
  }
  if (has_nul(job.payload)) {
    throw EnqueueError(
        "payload has a NUL character (\\u0000) in a string, which PostgreSQL's jsonb cannot "
        "store; remove it, or encode binary data (e.g. base64)");
  }
  if (payload_text->size() > max_payload) {
    throw EnqueueError("payload is " + std::to_string(payload_text->size()) +
                       " bytes; the limit is " + std::to_string(max_payload) +
                       " bytes: store large data elsewhere and enqueue a reference to it");
  }
}

// Runs `fn`, turning the SQL API's validation errors (SQLSTATE BTxxx) into EnqueueError.
template <class F>
auto translating(F fn) {
  try {
    return fn();
  } catch (const pqxx::sql_error& e) {
    if (e.sqlstate().rfind("BT", 0) != 0) throw;
    throw EnqueueError(detail::server_message(e));
  }
}

std::string utc_text(std::chrono::system_clock::time_point t) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  // Floored, so that a time before 1970 keeps a fraction in 0..999999.
  const long long whole = us / 1'000'000 - (us % 1'000'000 < 0 ? 1 : 0);
  const long long fraction = us - whole * 1'000'000;
  const std::time_t secs = static_cast<std::time_t>(whole);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, fraction);
  return buf;
}

// Appends `text` as a JSON string. ASCII is escaped here; other text goes through nlohmann, which
// refuses invalid UTF-8 as it always did.
void append_json_string(std::string& out, const std::string& text) {
  for (unsigned char c : text) {
    if (c >= 0x80) {
      out += nlohmann::json(text).dump();
      return;
    }
  }
  out += '"';
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// The jobs as the JSON array kEnqueueSql reads, written directly as text: each payload is
// serialised once (by check), not copied into a document and serialised again.
std::string encode(const std::vector<NewJob>& jobs, std::size_t max_payload) {
  std::string out = "[";
  std::string payload;
  for (const auto& job : jobs) {
    check(job, max_payload, &payload);
    const auto& o = job.options;
    if (out.size() > 1) out += ',';
    out += "{\"queue\":";
    append_json_string(out, o.queue);
    out += ",\"type\":";
    append_json_string(out, job.type);
    out += ",\"payload\":";
    out += payload;
    out += ",\"priority\":" + std::to_string(o.priority);
    out += ",\"delay_ms\":" + std::to_string(o.delay.count());
    out += ",\"max_attempts\":" + std::to_string(o.max_attempts);
    if (o.run_at) out += ",\"run_at\":\"" + utc_text(*o.run_at) + '"';
    if (!o.partition_key.empty()) {
      out += ",\"partition_key\":";
      append_json_string(out, o.partition_key);
    }
    if (!o.idempotency_key.empty()) {
      out += ",\"idempotency_key\":";
      append_json_string(out, o.idempotency_key);
    }
    // A negative timeout goes too, to be refused as enqueue_columns refuses it.
    if (o.timeout.count() != 0) out += ",\"timeout_ms\":" + std::to_string(o.timeout.count());
    out += '}';
  }
  return out + "]";
}

// True when every name and key of `jobs` is printable ASCII, as the columns' text arrays carry
// them, and every timeout fits the int column. (Anything else goes as JSON, whose encoder
// refuses what is not UTF-8, and whose checks answer an out-of-range timeout.)
bool fits_columns(const std::vector<NewJob>& jobs) {
  auto plain = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  };
  return std::all_of(jobs.begin(), jobs.end(), [&](const NewJob& j) {
    const auto timeout = j.options.timeout.count();
    return plain(j.type) && plain(j.options.queue) && plain(j.options.partition_key) &&
           plain(j.options.idempotency_key) && timeout >= std::numeric_limits<int>::min() &&
           timeout <= std::numeric_limits<int>::max();
  });
}

// One PostgreSQL array literal per column.
struct Columns {
  std::string queues = "{", types = "{", payloads = "[", priorities = "{", delays = "{",
              max_attempts = "{", run_at = "{", partition_keys = "{", idempotency_keys = "{",
              timeouts = "{";
};

void add_text(std::string& array, const std::string& value, bool null_if_empty) {
  if (array.size() > 1) array += ',';
  if (null_if_empty && value.empty()) {
    array += "NULL";
    return;
  }
  array += '"';
  for (char c : value) {
    if (c == '"' || c == '\\') array += '\\';
    array += c;
  }
  array += '"';
}

void add_plain(std::string& array, const std::string& value) {
  if (array.size() > 1) array += ',';
  array += value;
}

Columns encode_columns(const std::vector<NewJob>& jobs, std::size_t max_payload) {
  Columns c;
  std::string payload;
  for (const auto& job : jobs) {
    check(job, max_payload, &payload);
    const auto& o = job.options;
    add_text(c.queues, o.queue, false);
    add_text(c.types, job.type, false);
    add_plain(c.payloads, payload);
    add_plain(c.priorities, std::to_string(o.priority));
    add_plain(c.delays, std::to_string(o.delay.count()));
    add_plain(c.max_attempts, std::to_string(o.max_attempts));
    add_text(c.run_at, o.run_at ? utc_text(*o.run_at) : std::string(), true);
    add_text(c.partition_keys, o.partition_key, true);
    add_text(c.idempotency_keys, o.idempotency_key, true);
    add_plain(c.timeouts, std::to_string(o.timeout.count()));
  }
  for (auto* a : {&c.queues, &c.types, &c.priorities, &c.delays, &c.max_attempts, &c.run_at,
                  &c.partition_keys, &c.idempotency_keys, &c.timeouts}) {
    *a += '}';
  }
  c.payloads += ']';
  return c;
}

// `prepared`: the name under which kEnqueueSql is prepared on tx's connection (a Client's own
// connection), or empty to send it unprepared (a caller's connection, which we leave as it was).
// `columns`: send typed columns to enqueue_columns (prepared as kPreparedColumns) rather than
// JSON to enqueue_many. `one`: the single job goes to enqueue (prepared as kPreparedOne).
std::vector<std::int64_t> run_enqueue(pqxx::transaction_base& tx, const std::vector<NewJob>& jobs,
                                      const ClientOptions& options,
                                      const std::string& prepared = {}, bool columns = false,
                                      bool one = false) {
  if (jobs.empty()) return {};
  const std::string& schema = options.schema;
  pqxx::result rows;
  if (one) {
    std::string payload;
    check(jobs[0], options.max_payload_bytes, &payload);
    const auto& o = jobs[0].options;
    auto text_or_null = [](const std::string& v) {
      return v.empty() ? std::nullopt : std::optional<std::string>(v);
    };
    const std::optional<std::string> run_at =
        o.run_at ? std::optional<std::string>(utc_text(*o.run_at)) : std::nullopt;
    const auto pkey = text_or_null(o.partition_key);
    const auto ikey = text_or_null(o.idempotency_key);
    const int timeout = static_cast<int>(o.timeout.count());
    const std::int64_t delay_ms = o.delay.count();
    rows = translating([&] {
      return prepared.empty()
                 ? tx.exec_params(detail::with_schema(kOneSql, schema), o.queue, jobs[0].type,
                                  payload, o.priority, run_at, o.max_attempts, pkey, ikey, timeout,
                                  delay_ms)
                 : tx.exec_prepared(kPreparedOne, o.queue, jobs[0].type, payload, o.priority,
                                    run_at, o.max_attempts, pkey, ikey, timeout, delay_ms);
    });
    // enqueue answers a live idempotency key with that job's id, so the producer needs no right
    // to read jobs. NULL when the job with the key ended between its insert and its lookup: the
    // key is free then, and nothing was enqueued (the caller gets no id, as from a batch).
    if (!rows.empty() && rows[0][0].is_null()) return {};
  } else if (columns) {
    const Columns c = encode_columns(jobs, options.max_payload_bytes);
    rows = translating([&] {
      return prepared.empty()
                 ? tx.exec_params(detail::with_schema(kColumnsSql, schema), c.queues, c.types,
                                  c.payloads, c.priorities, c.delays, c.max_attempts, c.run_at,
                                  c.partition_keys, c.idempotency_keys, c.timeouts)
                 : tx.exec_prepared(kPreparedColumns, c.queues, c.types, c.payloads, c.priorities,
                                    c.delays, c.max_attempts, c.run_at, c.partition_keys,
                                    c.idempotency_keys, c.timeouts);
    });
  } else {
    const std::string encoded = encode(jobs, options.max_payload_bytes);
    rows = translating([&] {
      return prepared.empty() ? tx.exec_params(detail::with_schema(kEnqueueSql, schema), encoded)
                              : tx.exec_prepared(prepared, encoded);
    });
  }
  std::vector<std::int64_t> ids;
  ids.reserve(rows.size());
  for (const auto& r : rows)
    ids.push_back(r[0].as<std::int64_t>());
  // One job whose key is live already: the answer is the existing job's id.
  if (ids.empty() && jobs.size() == 1 && !jobs[0].options.idempotency_key.empty()) {
    auto existing = tx.exec_params(detail::with_schema(kExistingSql, schema), jobs[0].options.queue,
                                   jobs[0].options.idempotency_key);
    if (!existing.empty()) ids.push_back(existing[0][0].as<std::int64_t>());
  }
  return ids;
}

}  // namespace

std::vector<std::int64_t> enqueue_in(pqxx::transaction_base& tx, const std::vector<NewJob>& jobs,
                                     const ClientOptions& options) {
  return run_enqueue(tx, jobs, options);
}

struct Client::Impl {
  ClientOptions options;
  std::unique_ptr<pqxx::connection> conn;
  // Set for good once the server lost the prepared statement, or another client's was there:
  // a transaction pooler lends each statement any server connection.
  bool unprepared = false;
  // The role may call enqueue_columns, and enqueue (checked once, at connect).
  bool columns = false;
  bool one = false;

  // Runs `fn(statement)` with the prepared statement's name, or "" for unprepared; once more
  // unprepared when the server says the prepared statement is gone (it did not run, so it may).
  template <class F>
  auto with_statement(F fn) {
    if (unprepared) return fn(std::string());
    try {
      return fn(std::string(kPreparedEnqueue));
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() != "26000" && e.sqlstate() != "42P05") throw;
      unprepared = true;
      return fn(std::string());
    }
  }
};

Client::Client(const std::string& database_url, ClientOptions options) : impl_(new Impl) {
  detail::validate_schema_name(options.schema);
  impl_->options = std::move(options);
  std::string url = database_url;
  // NOLINTNEXTLINE(concurrency-mt-unsafe): getenv with no setenv in the library
  if (const char* env = std::getenv("DATABASE_URL"); url.empty() && env != nullptr) url = env;
  if (url.empty()) {
    throw ConfigError("database-url: a Client needs one; pass it or set DATABASE_URL");
  }
  // No session settings: every statement names the schema, so the Client may go through a
  // transaction pooler without leaving anything behind on its server connections.
  impl_->conn = detail::connect({.url = url,
                                 .schema = impl_->options.schema,
                                 .application_name = "baton-client",
                                 .session_settings = false});
  impl_->conn->prepare(kPreparedEnqueue, detail::with_schema(kEnqueueSql, impl_->options.schema));
  {
    pqxx::nontransaction tx(*impl_->conn);
    auto may_call = [&](const char* function, int arguments) {
      auto r = tx.exec_params(kMayCallSql, impl_->options.schema, function, arguments);
      return !r.empty() && r[0][0].as<bool>(false);
    };
    impl_->columns = may_call("enqueue_columns", 10);
    impl_->one = may_call("enqueue", 9);
  }
  if (impl_->columns) {
    impl_->conn->prepare(kPreparedColumns, detail::with_schema(kColumnsSql, impl_->options.schema));
  }
  if (impl_->one) {
    impl_->conn->prepare(kPreparedOne, detail::with_schema(kOneSql, impl_->options.schema));
  }
}

Client::~Client() = default;

std::vector<std::int64_t> Client::enqueue_batch(const std::vector<NewJob>& jobs) {
  // One statement, so it commits on its own: no BEGIN and COMMIT round trips. (The idempotency
  // lookup that may follow only reads.)
  const bool columns = impl_->columns && fits_columns(jobs);
  // A delay out of range goes through the columns, whose checks answer it (enqueue takes run_at).
  constexpr std::int64_t kMaxDelayMs = 3'153'600'000'000;  // 100 years, as the SQL API allows
  const bool one = impl_->one && columns && jobs.size() == 1 &&
                   jobs[0].options.delay.count() >= 0 &&
                   jobs[0].options.delay.count() <= kMaxDelayMs;
  auto ids = impl_->with_statement([&](const std::string& statement) {
    pqxx::nontransaction tx(*impl_->conn);
    return run_enqueue(tx, jobs, impl_->options, statement, columns, one);
  });
  if (ids.size() == jobs.size()) {
    for (const auto& j : jobs)
      detail::count_enqueued(j.options.queue, j.type, 1);
  }
  return ids;
}

std::vector<std::int64_t> Client::enqueue_objects(const nlohmann::json& jobs) {
  if (!jobs.is_array()) throw EnqueueError("jobs must be a JSON array of objects");
  if (jobs.empty()) return {};
  std::string text;
  try {
    text = jobs.dump();
  } catch (const nlohmann::json::exception& e) {
    throw EnqueueError(std::string("jobs are not valid JSON text (") + e.what() +
                       "); strings must be UTF-8");
  }
  if (has_nul(jobs)) {
    throw EnqueueError(
        "a job has a NUL character (\\u0000) in a string, which PostgreSQL's jsonb cannot store");
  }
  auto rows = impl_->with_statement([&](const std::string& statement) {
    pqxx::nontransaction tx(*impl_->conn);
    return translating([&] {
      return statement.empty()
                 ? tx.exec_params(detail::with_schema(kEnqueueSql, impl_->options.schema), text)
                 : tx.exec_prepared(statement, text);
    });
  });
  std::vector<std::int64_t> ids;
  ids.reserve(rows.size());
  for (const auto& r : rows)
    ids.push_back(r[0].as<std::int64_t>());
  return ids;
}

std::int64_t Client::enqueue(std::string_view type, const nlohmann::json& payload,
                             const EnqueueOptions& options) {
  auto ids = enqueue_batch({NewJob{std::string(type), payload, options}});
  if (ids.empty()) throw std::runtime_error("enqueue returned no id");
  return ids.front();
}

std::int64_t Client::enqueue_json(std::string_view type, std::string_view payload_json,
                                  const EnqueueOptions& options) {
  auto payload = nlohmann::json::parse(payload_json, nullptr, false);
  if (payload.is_discarded()) {
    throw EnqueueError("payload is not valid JSON: " + std::string(payload_json.substr(0, 200)));
  }
  return enqueue(type, payload, options);
}

std::vector<std::int64_t> Client::enqueue_copies(std::string_view type,
                                                 const nlohmann::json& payload, int count,
                                                 const EnqueueOptions& options) {
  if (count < 1 || count > 10'000'000) {
    throw EnqueueError("count " + std::to_string(count) + " is out of range; use 1..10000000");
  }
  if (!options.partition_key.empty() || !options.idempotency_key.empty() || options.run_at) {
    throw EnqueueError(
        "enqueue_copies takes no partition_key, idempotency_key or run_at; use enqueue_batch");
  }
  std::string text;
  check(NewJob{std::string(type), payload, options}, impl_->options.max_payload_bytes, &text);
  pqxx::work tx(*impl_->conn);
  const std::string& schema = impl_->options.schema;
  // Its statement's operators (and shard_of's, inlined) would be looked up on the caller's path.
  detail::search_schema_only(tx, schema);
  translating([&] {
    return tx.exec_params(
        detail::with_schema(kValidateSql, schema),
        encode({NewJob{std::string(type), payload, options}}, impl_->options.max_payload_bytes));
  });
  auto rows = tx.exec_params(detail::with_schema(kCopiesSql, impl_->options.schema), options.queue,
                             std::string(type), text, options.priority,
                             static_cast<std::int64_t>(options.delay.count()), options.max_attempts,
                             static_cast<int>(options.timeout.count()), count,
                             detail::jobs_channel(impl_->options.schema));
  tx.commit();
  detail::count_enqueued(options.queue, std::string(type), static_cast<std::int64_t>(rows.size()));
  std::vector<std::int64_t> ids;
  ids.reserve(rows.size());
  for (const auto& r : rows)
    ids.push_back(r[0].as<std::int64_t>());
  return ids;
}

std::vector<std::int64_t> Client::enqueue_many(std::string_view type,
                                               const std::vector<nlohmann::json>& payloads,
                                               const EnqueueOptions& options) {
  std::vector<NewJob> jobs;
  jobs.reserve(payloads.size());
  for (const auto& p : payloads)
    jobs.push_back(NewJob{std::string(type), p, options});
  return enqueue_batch(jobs);
}

}  // namespace baton

namespace baton {

void Client::declare_ordered_queue(std::string_view queue, int partitions) {
  detail::validate_name("queue", queue);
  if (partitions < 1 || partitions > 4096) {
    throw EnqueueError("partitions " + std::to_string(partitions) +
                       " is out of range; use 1..4096");
  }
  pqxx::work tx(*impl_->conn);
  tx.exec_params(detail::with_schema("INSERT INTO @.queue_state (queue, partitions, updated_by) "
                                     "VALUES ($1, $2, 'client') ON CONFLICT (queue) DO UPDATE SET "
                                     "partitions = excluded.partitions, updated_at = now()",
                                     impl_->options.schema),
                 std::string(queue), partitions);
  tx.commit();
}

}  // namespace baton

namespace baton {
namespace {

constexpr const char* kCancelSql = "SELECT @.cancel($1)";
constexpr const char* kByKeySql = "SELECT @.job_id_by_key($1, $2)";
constexpr const char* kStatusSql = R"sql(
SELECT id, queue, type, status, coalesce(attempts, 0), coalesce(max_attempts, 0),
       extract(epoch FROM run_at)::float8, extract(epoch FROM created_at)::float8,
       extract(epoch FROM finished_at)::float8, coalesce(last_error, '')
  FROM @.job_status($1)
)sql";

std::chrono::system_clock::time_point from_epoch(double seconds) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(seconds)));
}

CancelResult cancel_result(const std::string& text) {
  if (text == "cancelled") return CancelResult::cancelled;
  if (text == "cancelling") return CancelResult::cancelling;
  if (text == "finished") return CancelResult::finished;
  return CancelResult::not_found;
}

}  // namespace

std::string_view to_string(CancelResult result) {
  switch (result) {
    case CancelResult::cancelled:
      return "cancelled";
    case CancelResult::cancelling:
      return "cancelling";
    case CancelResult::finished:
      return "finished";
    case CancelResult::not_found:
      return "not_found";
  }
  return "not_found";
}

namespace detail {

void validate_name(std::string_view what, std::string_view name) {
  const std::string rule = " (use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit)";
  if (name.empty()) throw EnqueueError(std::string(what) + " name is empty" + rule);
  if (name.size() > 64) {
    throw EnqueueError(std::string(what) + " name is " + std::to_string(name.size()) +
                       " characters long" + rule);
  }
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(name[0])) {
    throw EnqueueError(std::string(what) + " name '" + std::string(name) +
                       "' does not start with a letter or digit" + rule);
  }
  for (char c : name) {
    if (!alnum(c) && c != '_' && c != '.' && c != ':' && c != '-') {
      throw EnqueueError(std::string(what) + " name '" + std::string(name) +
                         "' has a character that is not allowed" + rule);
    }
  }
}

CancelResult cancel_job(pqxx::transaction_base& tx, const std::string& schema, std::int64_t id) {
  return cancel_result(tx.exec_params(with_schema(kCancelSql, schema), id)[0][0].c_str());
}

std::optional<std::int64_t> job_id_by_key(pqxx::transaction_base& tx, const std::string& schema,
                                          std::string_view queue, std::string_view key) {
  const auto r =
      tx.exec_params(with_schema(kByKeySql, schema), std::string(queue), std::string(key));
  if (r[0][0].is_null()) return std::nullopt;
  return r[0][0].as<std::int64_t>();
}

std::optional<JobStatus> job_status(pqxx::transaction_base& tx, const std::string& schema,
                                    std::int64_t id) {
  const auto rows = tx.exec_params(with_schema(kStatusSql, schema), id);
  if (rows.empty()) return std::nullopt;
  const auto& r = rows[0];
  JobStatus s;
  s.id = r[0].as<std::int64_t>();
  s.queue = r[1].c_str();
  s.type = r[2].c_str();
  s.status = r[3].c_str();
  s.attempts = r[4].as<int>();
  s.max_attempts = r[5].as<int>();
  if (!r[6].is_null()) s.run_at = from_epoch(r[6].as<double>());
  s.created_at = from_epoch(r[7].as<double>());
  if (!r[8].is_null()) s.finished_at = from_epoch(r[8].as<double>());
  s.last_error = r[9].c_str();
  return s;
}

}  // namespace detail

CancelResult Client::cancel(std::int64_t id) {
  pqxx::work tx(*impl_->conn);
  const auto result = detail::cancel_job(tx, impl_->options.schema, id);
  tx.commit();
  return result;
}

CancelResult Client::cancel(std::string_view queue, std::string_view idempotency_key) {
  pqxx::work tx(*impl_->conn);
  const auto id = detail::job_id_by_key(tx, impl_->options.schema, queue, idempotency_key);
  const auto result =
      id ? detail::cancel_job(tx, impl_->options.schema, *id) : CancelResult::not_found;
  tx.commit();
  return result;
}

std::optional<JobStatus> Client::status(std::int64_t id) {
  pqxx::read_transaction tx(*impl_->conn);
  return detail::job_status(tx, impl_->options.schema, id);
}

std::optional<JobStatus> Client::status(std::string_view queue, std::string_view idempotency_key) {
  pqxx::read_transaction tx(*impl_->conn);
  const auto id = detail::job_id_by_key(tx, impl_->options.schema, queue, idempotency_key);
  if (!id) return std::nullopt;
  return detail::job_status(tx, impl_->options.schema, *id);
}

}  // namespace baton
