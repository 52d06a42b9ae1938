// Control requests and leader-channel signals (see control.h).
#include "baton/detail/control.h"

#include "baton/detail/db.h"

namespace baton::detail {
namespace {

constexpr const char* kSendSql = R"sql(
INSERT INTO @.control_requests (kind, target, lock_group, note)
VALUES ($1, $2, nullif($3, ''), nullif($4, ''))
RETURNING id
)sql";

constexpr const char* kPendingSql = R"sql(
SELECT id, requested_by, coalesce(note, ''), now() - requested_at > $3::bigint * interval '1 second'
  FROM control_requests
 WHERE handled_at IS NULL AND kind = 'step_down' AND (target = $1 OR target = '*')
   AND (lock_group IS NULL OR lock_group = $2)
 ORDER BY id
 LIMIT 100
 FOR UPDATE SKIP LOCKED
)sql";

constexpr const char* kHandledSql = R"sql(
UPDATE control_requests SET handled_at = now(), handled_by = $2, outcome = $3
 WHERE id = $1 AND handled_at IS NULL
)sql";

const char* kind_name(ControlKind kind) {
  switch (kind) {
    case ControlKind::step_down:
      return "step_down";
  }
  return "step_down";
}

}  // namespace

std::int64_t send_control(pqxx::transaction_base& tx, const std::string& schema,
                          const ControlRequest& request) {
  const auto id = tx.exec_params(with_schema(kSendSql, schema), kind_name(request.kind),
                                 request.target, request.lock_group, request.note)[0][0]
                      .as<std::int64_t>();
  tx.exec_params("SELECT pg_catalog.pg_notify($1, $2)", leader_channel(schema),
                 LeaderSignal{LeaderSignal::control, ""}.encode());
  return id;
}

std::vector<TakenRequest> take_control(pqxx::connection& conn, const std::string& node_id,
                                       const std::string& lock_group, bool may_accept,
                                       std::chrono::seconds max_age) {
  pqxx::work tx(conn);
  std::vector<TakenRequest> out;
  for (const auto& r : tx.exec_params(kPendingSql, node_id, lock_group,
                                      static_cast<std::int64_t>(max_age.count()))) {
    TakenRequest t;
    t.id = r[0].as<std::int64_t>();
    t.requested_by = r[1].c_str();
    t.note = r[2].c_str();
    if (r[3].as<bool>()) {
      t.outcome = "expired (not handled within " + std::to_string(max_age.count()) + "s)";
    } else if (!may_accept) {
      t.outcome =
          "refused: this leader stepped down moments ago (at most one step-down per "
          "interval)";
    } else {
      t.accepted = true;
      t.outcome = "accepted";
      may_accept = false;
    }
    tx.exec_params(kHandledSql, t.id, node_id, t.outcome);
    out.push_back(std::move(t));
  }
  tx.commit();
  return out;
}

std::string LeaderSignal::encode() const {
  return kind == released ? "released " + node : std::string("control");
}

std::optional<LeaderSignal> LeaderSignal::parse(const std::string& payload) {
  if (payload == "control") return LeaderSignal{control, ""};
  if (payload.rfind("released ", 0) == 0) return LeaderSignal{released, payload.substr(9)};
  return std::nullopt;
}

}  // namespace baton::detail
