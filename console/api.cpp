// The console's reads and actions (see api.h).
#include "console/api.h"

#include <algorithm>
#include <charconv>
#include <vector>

#include "baton/admin.h"
#include "baton/detail/db.h"
#include "baton/detail/inspect.h"

namespace baton::console {
namespace {

using detail::inspect::to_json;

constexpr int kSearchLimit = 100;
constexpr int kDeadLimit = 200;
constexpr std::int64_t kWindowMinutes = 60;
constexpr std::int64_t kChunkMinutes = 10;

constexpr const char* kTimelineSql = R"sql(
SELECT id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS at, lock_key, region,
       epoch, node_id, host, event, reason, previous_node, previous_epoch,
       round(previous_renewed_s_ago::numeric, 3) AS previous_renewed_s_ago
  FROM leadership_events ORDER BY id DESC LIMIT 100
)sql";

// One pass over the live queue (the same cost as the leader's depth sampler, and paced like it
// by the caller's cache); dead letters by their queue index.
constexpr const char* kQueuesSql = R"sql(
WITH live AS (
  SELECT queue,
         count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
         count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
         count(*) FILTER (WHERE state = 'running') AS running,
         round(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE state = 'available' AND run_at <= now()))::numeric, 3) AS oldest_available_s
    FROM jobs GROUP BY queue),
dead AS (SELECT queue, count(*) AS dead FROM dead_jobs GROUP BY queue)
SELECT q.queue, coalesce(s.paused, false) AS paused, coalesce(l.available, 0) AS available,
       coalesce(l.scheduled, 0) AS scheduled, coalesce(l.running, 0) AS running,
       coalesce(d.dead, 0) AS dead, l.oldest_available_s, s.updated_by,
       to_char(s.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS updated_at
  FROM (SELECT queue FROM live UNION SELECT queue FROM dead UNION SELECT queue FROM queue_state) q
  LEFT JOIN live l USING (queue) LEFT JOIN dead d USING (queue)
  LEFT JOIN queue_state s USING (queue)
 ORDER BY q.queue
)sql";

// History by its finished_at index, minutes [$1, $2) (seconds since the epoch).
constexpr const char* kSeriesSql = R"sql(
SELECT extract(epoch FROM date_trunc('minute', finished_at))::bigint AS minute, queue,
       count(*) FILTER (WHERE outcome = 'completed') AS completed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at))
         * 1000 AS wait_p50_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY run_seconds) * 1000 AS run_p50_ms
  FROM job_history WHERE finished_at >= to_timestamp($1) AND finished_at < to_timestamp($2)
 GROUP BY 1, 2
)sql";
constexpr const char* kSeriesDeadSql = R"sql(
SELECT extract(epoch FROM date_trunc('minute', died_at))::bigint AS minute, queue, count(*)
  FROM dead_jobs WHERE died_at >= to_timestamp($1) AND died_at < to_timestamp($2)
 GROUP BY 1, 2
)sql";

// Newest first in each place a job can be; a branch whose state cannot match is skipped by the
// planner. $1 id (0: any), $2 queue, $3 type, $4 partition key, $5 state ('' any), $6 limit.
constexpr const char* kJobsSql = R"sql(
SELECT * FROM (
  (SELECT id, queue, type, partition_key,
          CASE WHEN state = 'running' THEN 'running' WHEN run_at > now() THEN 'scheduled'
               ELSE 'available' END AS state,
          attempts, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS created_at,
          left(last_error, 200) AS last_error
     FROM jobs
    WHERE $5 IN ('', 'available', 'scheduled', 'running') AND ($1::bigint = 0 OR id = $1::bigint)
      AND ($2 = '' OR queue = $2) AND ($3 = '' OR type = $3) AND ($4 = '' OR partition_key = $4)
      AND ($5 = '' OR $5 = CASE WHEN state = 'running' THEN 'running'
                                WHEN run_at > now() THEN 'scheduled' ELSE 'available' END)
    ORDER BY id DESC LIMIT $6)
  UNION ALL
  (SELECT id, queue, type, partition_key, outcome, attempts,
          to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), left(last_error, 200)
     FROM job_history
    WHERE $5 IN ('', 'completed', 'cancelled') AND ($1::bigint = 0 OR id = $1::bigint)
      AND ($2 = '' OR queue = $2) AND ($3 = '' OR type = $3) AND ($4 = '' OR partition_key = $4)
      AND ($5 = '' OR outcome = $5)
    ORDER BY id DESC LIMIT $6)
  UNION ALL
  (SELECT id, queue, type, partition_key, 'dead', attempts,
          to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), left(last_error, 200)
     FROM dead_jobs
    WHERE $5 IN ('', 'dead') AND ($1::bigint = 0 OR id = $1::bigint)
      AND ($2 = '' OR queue = $2) AND ($3 = '' OR type = $3) AND ($4 = '' OR partition_key = $4)
    ORDER BY id DESC LIMIT $6)
) found ORDER BY id DESC LIMIT $6
)sql";

constexpr const char* kDeadCountSql =
    "SELECT count(*) FROM dead_jobs WHERE ($1 = '' OR queue = $1)";

constexpr const char* kSagaByPropertySql = R"sql(
SELECT s.id, s.type, s.version,
       (SELECT string_agg(x.property || '=' || x.value, ' ' ORDER BY x.property)
          FROM saga_index x WHERE x.saga_id = s.id) AS indexed,
       to_char(s.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS updated_at,
       to_char(s.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS completed_at
  FROM saga_index i JOIN sagas s ON s.id = i.saga_id
 WHERE ($1 = '' OR i.type = $1) AND i.property = $2 AND i.value = $3
 ORDER BY s.updated_at DESC LIMIT 50
)sql";

std::string param(const Params& p, const std::string& name, std::size_t max = 200) {
  const auto it = p.find(name);
  if (it == p.end()) return "";
  if (it->second.size() > max) {
    throw ApiError{400, name + " is longer than " + std::to_string(max) + " characters"};
  }
  return it->second;
}

std::int64_t parse_id(const std::string& text, const std::string& what) {
  std::int64_t id = 0;
  const auto* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, id);
  if (ec != std::errc{} || p != end || id <= 0) {
    throw ApiError{400, what + " '" + text.substr(0, 40) + "' is not a job id (a positive number)"};
  }
  return id;
}

std::string text_of(const Json& row, const char* key) {
  const auto it = row.find(key);
  if (it == row.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

Json step(const std::string& at, const std::string& event, const Json& node, const Json& epoch,
          const std::string& detail) {
  return Json{{"at", at}, {"event", event}, {"node", node}, {"epoch", epoch}, {"detail", detail}};
}

// The story of a job as rows of (at, event, node, epoch, detail), oldest first.
Json story_of(const Json& j) {
  Json story = Json::array();
  const auto status = text_of(j, "status");
  story.push_back(step(text_of(j, "created_at"), "enqueued", nullptr, nullptr,
                       "queue " + text_of(j, "queue") + ", type " + text_of(j, "type")));
  if (j.contains("errors") && j["errors"].is_array()) {
    for (const auto& e : j["errors"]) {
      story.push_back(step(text_of(e, "at"), "attempt " + text_of(e, "attempt") + " failed",
                           e.value("node", Json()), e.value("epoch", Json()), text_of(e, "error")));
    }
  }
  if (status == "live") {
    const auto now = text_of(j, "now");
    if (now == "running" || now == "cancelling") {
      story.push_back(step(text_of(j, "claimed_at"),
                           "attempt " + text_of(j, "attempts") + " " + now,
                           j.value("claimed_by", Json()), j.value("claimed_epoch", Json()), ""));
    } else {
      story.push_back(
          step(text_of(j, "run_at"), now, nullptr, nullptr,
               text_of(j, "attempts") + " of " + text_of(j, "max_attempts") + " attempts used"));
    }
  } else if (status == "finished") {
    std::string detail =
        "attempt " + text_of(j, "attempts") + " started " + text_of(j, "started_at");
    if (!text_of(j, "run_seconds").empty()) detail += ", ran " + text_of(j, "run_seconds") + " s";
    if (!text_of(j, "last_error").empty()) detail += "; last error: " + text_of(j, "last_error");
    story.push_back(step(text_of(j, "finished_at"), text_of(j, "outcome"), j.value("node", Json()),
                         j.value("epoch", Json()), detail));
  } else if (status == "dead") {
    story.push_back(step(text_of(j, "died_at"), "dead (" + text_of(j, "reason") + ")",
                         j.value("node", Json()), j.value("epoch", Json()),
                         text_of(j, "last_error")));
  }
  return story;
}

std::vector<std::int64_t> ids_of(const Json& request) {
  if (!request.contains("ids") || !request["ids"].is_array() || request["ids"].empty()) {
    throw ApiError{400, "ids: give the dead letters' ids as a list"};
  }
  if (request["ids"].size() > 1000) throw ApiError{400, "ids: at most 1000 at once"};
  std::vector<std::int64_t> ids;
  for (const auto& v : request["ids"]) {
    if (!v.is_number_integer() || v.get<std::int64_t>() <= 0) {
      throw ApiError{400, "ids: " + v.dump().substr(0, 40) + " is not a job id"};
    }
    ids.push_back(v.get<std::int64_t>());
  }
  return ids;
}

std::string string_field(const Json& request, const char* name) {
  if (!request.contains(name) || request[name].is_null()) return "";
  if (!request[name].is_string()) throw ApiError{400, std::string(name) + " must be a string"};
  return request[name].get<std::string>();
}

}  // namespace

Json cluster(pqxx::transaction_base& tx) {
  return Json{{"leaders", to_json(detail::inspect::leaders(tx))},
              {"nodes", to_json(detail::inspect::nodes(tx))},
              {"timeline", to_json(tx.exec(kTimelineSql))}};
}

Json queues(pqxx::transaction_base& tx) {
  return to_json(tx.exec(kQueuesSql));
}

Json Series::read(pqxx::transaction_base& tx) {
  std::lock_guard lock(mutex_);
  const auto now = tx.exec("SELECT extract(epoch FROM date_trunc('minute', now()))::bigint")[0][0]
                       .as<std::int64_t>();
  const auto window = now - (kWindowMinutes - 1) * 60;
  minutes_.erase(minutes_.begin(), minutes_.lower_bound(window));
  auto load = [&](std::int64_t from, std::int64_t to) {
    minutes_.erase(minutes_.lower_bound(from), minutes_.lower_bound(to));
    for (const auto& r : tx.exec_params(kSeriesSql, from, to)) {
      auto& m = minutes_[r[0].as<std::int64_t>()][r[1].c_str()];
      m.completed = r[2].as<std::int64_t>();
      m.wait_p50_ms = r[3].is_null() ? -1 : r[3].as<double>();
      m.run_p50_ms = r[4].is_null() ? -1 : r[4].as<double>();
    }
    for (const auto& r : tx.exec_params(kSeriesDeadSql, from, to))
      minutes_[r[0].as<std::int64_t>()][r[1].c_str()].dead = r[2].as<std::int64_t>();
  };
  // The recent minutes every time (the last two complete ones again: a completion commits a
  // moment after its finished_at), and the rest of the hour in chunks of kChunkMinutes, newest
  // first, one chunk a read: no read covers more than a few minutes of a busy history.
  const auto recent = complete_until_ == 0 ? std::max(window, now - (kChunkMinutes - 1) * 60)
                                           : std::max(window, complete_until_ - 120);
  load(recent, now + 60);
  if (filled_from_ == 0 || filled_from_ > recent) filled_from_ = recent;
  if (filled_from_ > window) {
    const auto from = std::max(window, filled_from_ - kChunkMinutes * 60);
    load(from, filled_from_);
    filled_from_ = from;
  }
  filled_from_ = std::max(filled_from_, window);
  complete_until_ = now;

  std::map<std::string, Json> by_queue;
  for (const auto& [minute, queues] : minutes_) {
    for (const auto& [queue, _] : queues)
      by_queue.emplace(queue, Json::array());
  }
  for (auto& [queue, points] : by_queue) {
    for (auto t = window; t <= now; t += 60) {
      Minute m;
      if (const auto it = minutes_.find(t); it != minutes_.end()) {
        if (const auto q = it->second.find(queue); q != it->second.end()) m = q->second;
      }
      points.push_back(Json{{"minute", t},
                            {"completed", m.completed},
                            {"dead", m.dead},
                            {"wait_p50_ms", m.wait_p50_ms < 0 ? Json() : Json(m.wait_p50_ms)},
                            {"run_p50_ms", m.run_p50_ms < 0 ? Json() : Json(m.run_p50_ms)}});
    }
  }
  Json out = Json::object();
  for (auto& [queue, points] : by_queue)
    out[queue] = std::move(points);
  return out;
}

Json jobs(pqxx::transaction_base& tx, const Params& p) {
  const auto id_text = param(p, "id", 20);
  const std::int64_t id = id_text.empty() ? 0 : parse_id(id_text, "id");
  const auto state = param(p, "state", 20);
  static const std::vector<std::string> kStates{"",          "available", "scheduled", "running",
                                                "completed", "cancelled", "dead"};
  if (std::find(kStates.begin(), kStates.end(), state) == kStates.end()) {
    throw ApiError{400, "state '" + state +
                            "' is not one of available, scheduled, running, completed, "
                            "cancelled, dead"};
  }
  return Json{{"jobs", to_json(tx.exec_params(kJobsSql, id, param(p, "queue"), param(p, "type"),
                                              param(p, "key"), state, kSearchLimit))},
              {"limit", kSearchLimit}};
}

Json job(pqxx::transaction_base& tx, const Params& p) {
  const auto id = parse_id(param(p, "id", 20), "id");
  const auto rows = to_json(detail::inspect::job(tx, id));
  if (rows.empty()) throw ApiError{404, "no job " + std::to_string(id) + " (or it was pruned)"};
  return Json{{"job", rows[0]}, {"story", story_of(rows[0])}};
}

Json dead(pqxx::transaction_base& tx, const Params& p) {
  const auto queue = param(p, "queue", 64);
  return Json{{"dead", to_json(detail::inspect::dead_list(tx, queue, kDeadLimit))},
              {"total", tx.exec_params(kDeadCountSql, queue)[0][0].as<std::int64_t>()},
              {"limit", kDeadLimit}};
}

Json schedules(pqxx::transaction_base& tx) {
  return detail::inspect::schedules(tx);
}

Json sagas(pqxx::transaction_base& tx, const Params& p) {
  const auto id = param(p, "id", 64);
  if (!id.empty()) return Json{{"sagas", to_json(detail::inspect::saga(tx, id))}};
  const auto type = param(p, "type", 64);
  const auto property = param(p, "property");
  if (!property.empty()) {
    return Json{{"sagas", to_json(tx.exec_params(kSagaByPropertySql, type, property,
                                                 param(p, "value", 1000)))}};
  }
  return Json{{"sagas", to_json(detail::inspect::sagas(tx, type, true, 50))}};
}

Json act(pqxx::connection& conn, const std::string& schema, const std::string& actor,
         const Json& request) {
  if (!request.is_object() || !request.contains("action") || !request["action"].is_string()) {
    throw ApiError{400, "the request is {\"action\": ..., ...}"};
  }
  const auto action = request["action"].get<std::string>();
  Admin admin(conn, schema, actor);
  try {
    if (action == "pause" || action == "resume") {
      const auto queue = string_field(request, "queue");
      const bool known = admin.set_paused(queue, action == "pause");
      return Json{{"message", "queue " + queue + (action == "pause" ? " paused" : " resumed") +
                                  (known ? "" : " (no job or setting of it is known)")}};
    }
    if (action == "retry" || action == "discard") {
      const auto ids = ids_of(request);
      std::size_t done = 0;
      for (const auto id : ids)
        done += (action == "retry" ? admin.retry_dead(id) : admin.discard_dead(id)) ? 1 : 0;
      return Json{{"message", std::to_string(done) + " of " + std::to_string(ids.size()) +
                                  " dead letters " +
                                  (action == "retry" ? "back in the queue" : "discarded") +
                                  (done < ids.size() ? " (the others were gone)" : "")},
                  {"done", done}};
    }
    if (action == "retry_all") {
      const auto queue = string_field(request, "queue");
      const auto n = admin.retry_dead_all(queue);
      return Json{
          {"message", std::to_string(n) + " dead letters" +
                          (queue.empty() ? "" : " of queue " + queue) + " back in the queue"},
          {"done", n}};
    }
    if (action == "step_down") {
      auto node = string_field(request, "node");
      if (node.empty()) node = "*";
      // A node id is printable ASCII without spaces (config.h).
      if (node.size() > 63 ||
          std::any_of(node.begin(), node.end(), [](char c) { return c < 0x21 || c > 0x7e; })) {
        throw ApiError{400, "node: a node id is 1..63 printable characters without spaces"};
      }
      const auto id = admin.request_step_down(node, actor);
      return Json{{"message", "step-down request " + std::to_string(id) + " sent to " +
                                  (node == "*" ? std::string("the leader") : node)}};
    }
  } catch (const AdminError& e) {
    throw ApiError{400, e.what()};
  } catch (const pqxx::insufficient_privilege& e) {
    throw ApiError{403, "the console's database role may not do this (" +
                            detail::server_message(e) +
                            "); give --console-database-url an operator's role "
                            "(docs/security.md lists its grants)"};
  }
  throw ApiError{400, "unknown action '" + action.substr(0, 40) +
                          "'; use pause, resume, retry, retry_all, discard or step_down"};
}

}  // namespace baton::console
