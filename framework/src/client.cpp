// Client: producers' side of the queue. Each enqueue is one statement that inserts the rows and
// sends one NOTIFY for the whole statement (PostgreSQL folds identical notifications).
#include "baton/client.h"

#include "baton/detail/db.h"

namespace baton {
namespace {

constexpr std::size_t kMaxPayloadBytes = 1 << 20;

// $1 queue, $2 type, $3 priority, $4 delay ms, $5 max attempts, $6 channel, $7 payload(s).
constexpr const char* kEnqueueOneSql = R"sql(
WITH j AS (
  INSERT INTO jobs (queue, type, payload, priority, run_at, max_attempts)
  VALUES ($1, $2, $7::jsonb, $3, now() + $4::bigint * interval '1 millisecond', $5)
  RETURNING id),
n AS (SELECT pg_notify($6, $1))
SELECT j.id FROM j CROSS JOIN n
)sql";

constexpr const char* kEnqueueCopiesSql = R"sql(
WITH j AS (
  INSERT INTO jobs (queue, type, payload, priority, run_at, max_attempts)
  SELECT $1, $2, $7::jsonb, $3, now() + $4::bigint * interval '1 millisecond', $5
    FROM generate_series(1, $8::int)
  RETURNING id),
n AS (SELECT pg_notify($6, $1))
SELECT j.id FROM j CROSS JOIN n
)sql";

constexpr const char* kEnqueueManySql = R"sql(
WITH j AS (
  INSERT INTO jobs (queue, type, payload, priority, run_at, max_attempts)
  SELECT $1, $2, p.value, $3, now() + $4::bigint * interval '1 millisecond', $5
    FROM jsonb_array_elements($7::jsonb) WITH ORDINALITY AS p(value, ord)
   ORDER BY p.ord
  RETURNING id),
n AS (SELECT pg_notify($6, $1))
SELECT j.id FROM j CROSS JOIN n
)sql";

void check_options(std::string_view type, const EnqueueOptions& o) {
  validate_name("queue", o.queue);
  validate_name("type", type);
  if (o.priority < -32768 || o.priority > 32767) {
    throw EnqueueError("priority " + std::to_string(o.priority) +
                       " is out of range; use -32768..32767 (lower runs first)");
  }
  if (o.max_attempts < 1 || o.max_attempts > 1000) {
    throw EnqueueError("max_attempts " + std::to_string(o.max_attempts) +
                       " is out of range; use 1..1000");
  }
  if (o.delay.count() < 0) throw EnqueueError("delay must not be negative");
}

std::string dump_payload(const nlohmann::json& payload) {
  std::string text;
  try {
    text = payload.dump();
  } catch (const nlohmann::json::exception& e) {
    throw EnqueueError(std::string("payload is not valid JSON text (") + e.what() +
                       "); strings must be UTF-8");
  }
  if (text.size() > kMaxPayloadBytes) {
    throw EnqueueError("payload is " + std::to_string(text.size()) + " bytes; the limit is " +
                       std::to_string(kMaxPayloadBytes) +
                       " bytes: store large data elsewhere "
                       "and enqueue a reference to it");
  }
  return text;
}

std::vector<std::int64_t> ids_of(const pqxx::result& rows) {
  std::vector<std::int64_t> ids;
  ids.reserve(rows.size());
  for (const auto& r : rows)
    ids.push_back(r[0].as<std::int64_t>());
  return ids;
}

}  // namespace

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

struct Client::Impl {
  std::string schema;
  std::unique_ptr<pqxx::connection> conn;

  pqxx::result run(const char* sql, std::string_view type, const EnqueueOptions& o,
                   const std::string& payload, int count) {
    pqxx::work tx(*conn);
    auto rows = count > 0
                    ? tx.exec_params(sql, o.queue, std::string(type), o.priority,
                                     static_cast<std::int64_t>(o.delay.count()), o.max_attempts,
                                     detail::jobs_channel(schema), payload, count)
                    : tx.exec_params(sql, o.queue, std::string(type), o.priority,
                                     static_cast<std::int64_t>(o.delay.count()), o.max_attempts,
                                     detail::jobs_channel(schema), payload);
    tx.commit();
    return rows;
  }
};

Client::Client(const std::string& database_url, std::string schema) : impl_(new Impl) {
  detail::validate_schema_name(schema);
  impl_->schema = schema;
  impl_->conn =
      detail::connect({.url = database_url, .schema = schema, .application_name = "baton-client"});
}

Client::~Client() = default;

std::int64_t Client::enqueue(std::string_view type, const nlohmann::json& payload,
                             const EnqueueOptions& options) {
  check_options(type, options);
  return ids_of(impl_->run(kEnqueueOneSql, type, options, dump_payload(payload), 0)).at(0);
}

std::vector<std::int64_t> Client::enqueue_copies(std::string_view type,
                                                 const nlohmann::json& payload, int count,
                                                 const EnqueueOptions& options) {
  check_options(type, options);
  if (count < 1 || count > 10'000'000) {
    throw EnqueueError("count " + std::to_string(count) + " is out of range; use 1..10000000");
  }
  return ids_of(impl_->run(kEnqueueCopiesSql, type, options, dump_payload(payload), count));
}

std::vector<std::int64_t> Client::enqueue_many(std::string_view type,
                                               const std::vector<nlohmann::json>& payloads,
                                               const EnqueueOptions& options) {
  check_options(type, options);
  if (payloads.empty()) return {};
  nlohmann::json all = nlohmann::json::array();
  for (const auto& p : payloads) {
    dump_payload(p);  // checks each payload's size on its own
    all.push_back(p);
  }
  return ids_of(impl_->run(kEnqueueManySql, type, options, all.dump(), 0));
}

}  // namespace baton
