// Saga store (see baton/saga.h). Loads lock the saga row FOR UPDATE, so two jobs of one saga
// serialise inside their transactions; saves check the version for callers that loaded outside
// one.
#include "baton/saga.h"

#include <pqxx/subtransaction>

#include "baton/detail/db.h"

namespace baton {
namespace {

constexpr const char* kFindSql = R"sql(
SELECT s.id::text, s.version, s.completed_at IS NOT NULL, s.data::text
  FROM @.saga_index i JOIN @.sagas s ON s.id = i.saga_id
 WHERE i.type = $1 AND i.property = $2 AND i.value = $3
   FOR UPDATE OF s
)sql";

constexpr const char* kGetSql = R"sql(
SELECT id::text, version, completed_at IS NOT NULL, data::text
  FROM @.sagas WHERE id = $1::uuid AND type = $2
   FOR UPDATE
)sql";

constexpr const char* kInsertSql = R"sql(
INSERT INTO @.sagas (type, data) VALUES ($1, $2::jsonb) RETURNING id::text, version
)sql";

constexpr const char* kUpdateSql = R"sql(
UPDATE @.sagas SET data = $2::jsonb, version = version + 1, updated_at = now()
 WHERE id = $1::uuid AND version = $3
RETURNING version
)sql";

constexpr const char* kClearIndexSql = "DELETE FROM @.saga_index WHERE saga_id = $1::uuid";

constexpr const char* kIndexSql = R"sql(
INSERT INTO @.saga_index (type, property, value, saga_id) VALUES ($1, $2, $3, $4::uuid)
)sql";

constexpr const char* kCompleteSql =
    "UPDATE @.sagas SET completed_at = now(), updated_at = now() WHERE id = $1::uuid";

std::optional<detail::SagaRow> read(const pqxx::result& r) {
  if (r.empty()) return std::nullopt;
  return detail::SagaRow{r[0][0].c_str(), r[0][1].as<int>(), r[0][2].as<bool>(),
                         nlohmann::json::parse(r[0][3].c_str())};
}

}  // namespace

SagaStore::SagaStore(const std::string& schema) {
  detail::validate_schema_name(schema);
  schema_ = schema;
}

std::optional<detail::SagaRow> SagaStore::find_raw(pqxx::dbtransaction& tx, std::string_view type,
                                                   const std::vector<std::string>& declared,
                                                   std::string_view property,
                                                   std::string_view value) const {
  bool known = false;
  std::string names;
  for (const auto& p : declared) {
    known = known || p == property;
    names += (names.empty() ? "" : ", ") + p;
  }
  if (!known) {
    throw std::invalid_argument("saga type '" + std::string(type) + "' has no indexed property '" +
                                std::string(property) + "'; add it to indexed() of the type" +
                                (names.empty() ? "" : " (indexed now: " + names + ")"));
  }
  return read(tx.exec_params(detail::with_schema(kFindSql, schema_), std::string(type),
                             std::string(property), std::string(value)));
}

std::optional<detail::SagaRow> SagaStore::get_raw(pqxx::dbtransaction& tx, std::string_view type,
                                                  std::string_view id) const {
  return read(
      tx.exec_params(detail::with_schema(kGetSql, schema_), std::string(id), std::string(type)));
}

void SagaStore::save_raw(pqxx::dbtransaction& tx, std::string_view type,
                         const std::vector<std::string>& indexed, detail::SagaRow& saga) const {
  if (saga.completed) {
    throw SagaConflict("saga " + saga.id + " is completed; start a new saga instead");
  }
  const std::string data = saga.data.dump();
  if (saga.id.empty()) {
    auto r = tx.exec_params(detail::with_schema(kInsertSql, schema_), std::string(type), data);
    saga.id = r[0][0].c_str();
    saga.version = r[0][1].as<int>();
  } else {
    auto r = tx.exec_params(detail::with_schema(kUpdateSql, schema_), saga.id, data, saga.version);
    if (r.empty()) {
      throw SagaConflict("saga " + saga.id + " changed since it was loaded at version " +
                         std::to_string(saga.version) + "; load it again and retry");
    }
    saga.version = r[0][0].as<int>();
  }
  tx.exec_params(detail::with_schema(kClearIndexSql, schema_), saga.id);
  for (const auto& property : indexed) {
    const auto it = saga.data.find(property);
    if (it == saga.data.end() || it->is_null()) continue;
    const std::string value = it->is_string() ? it->get<std::string>() : it->dump();
    // A savepoint, so that a taken value becomes a SagaConflict and not an aborted transaction.
    pqxx::subtransaction sub(tx, "saga_index");
    try {
      sub.exec_params(detail::with_schema(kIndexSql, schema_), std::string(type), property, value,
                      saga.id);
      sub.commit();
    } catch (const pqxx::unique_violation&) {
      throw SagaConflict("another saga of type '" + std::string(type) + "' has " + property +
                         " = " + value);
    }
  }
}

void SagaStore::complete_raw(pqxx::dbtransaction& tx, const std::string& id) const {
  tx.exec_params(detail::with_schema(kClearIndexSql, schema_), id);
  tx.exec_params(detail::with_schema(kCompleteSql, schema_), id);
}

}  // namespace baton
