// Sagas: long-running workflow state kept beside the jobs, loaded with a row lock and saved in
// the same transaction as the job that handles a message, so it changes exactly when the job
// commits (use them in transactional handlers: node.handle_tx).
//
// A saga type declares itself once:
//   struct OrderSaga {
//     static constexpr const char* saga_type = "order";
//     static std::vector<std::string> indexed() { return {"order_id"}; }
//     std::string order_id, state;
//   };  // plus nlohmann-json to_json/from_json
// Indexed properties are top-level fields of the saga's JSON; their values find the saga.
//
// SagaStore is immutable: share it freely. Its calls run on the transaction you pass.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <pqxx/dbtransaction>

namespace baton {

// A save that lost a race: the saga changed since it was loaded (outside a locking transaction),
// or another saga of the type holds an indexed value. Load again and retry.
class SagaConflict : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
// A saga as stored: its data as JSON. SagaStore's typed calls convert it.
struct SagaRow {
  std::string id;
  int version = 0;
  bool completed = false;
  nlohmann::json data;
};
}  // namespace detail

template <class T>
struct Saga {
  std::string id;   // empty until first saved
  int version = 0;  // 0 until first saved
  bool completed = false;
  T data{};
};

class SagaStore {
 public:
  explicit SagaStore(const std::string& schema = "baton");

  // Loads the saga whose indexed `property` equals `value`, locked FOR UPDATE until the
  // transaction ends. Throws std::invalid_argument when T does not declare `property`.
  template <class T>
  std::optional<Saga<T>> find(pqxx::dbtransaction& tx, std::string_view property,
                              std::string_view value) const {
    return typed<T>(find_raw(tx, T::saga_type, T::indexed(), property, value));
  }
  // Loads a saga by id, locked FOR UPDATE until the transaction ends.
  template <class T>
  std::optional<Saga<T>> get(pqxx::dbtransaction& tx, std::string_view id) const {
    return typed<T>(get_raw(tx, T::saga_type, id));
  }
  // Inserts a new saga (empty id) or updates it (version must still match), and replaces its
  // index rows. Throws SagaConflict on a lost race or a taken indexed value.
  template <class T>
  void save(pqxx::dbtransaction& tx, Saga<T>& saga) const {
    detail::SagaRow raw{saga.id, saga.version, saga.completed, nlohmann::json(saga.data)};
    save_raw(tx, T::saga_type, T::indexed(), raw);
    saga.id = raw.id;
    saga.version = raw.version;
  }
  // Marks the saga completed (keeping its data for audit until pruned) and removes its index
  // rows, so its correlation values are free for a new saga.
  template <class T>
  void complete(pqxx::dbtransaction& tx, Saga<T>& saga) const {
    save(tx, saga);
    complete_raw(tx, saga.id);
    saga.completed = true;
  }

 private:
  std::optional<detail::SagaRow> find_raw(pqxx::dbtransaction& tx, std::string_view type,
                                          const std::vector<std::string>& declared,
                                          std::string_view property, std::string_view value) const;
  std::optional<detail::SagaRow> get_raw(pqxx::dbtransaction& tx, std::string_view type,
                                         std::string_view id) const;
  void save_raw(pqxx::dbtransaction& tx, std::string_view type,
                const std::vector<std::string>& indexed, detail::SagaRow& saga) const;
  void complete_raw(pqxx::dbtransaction& tx, const std::string& id) const;

  template <class T>
  static std::optional<Saga<T>> typed(std::optional<detail::SagaRow> raw) {
    if (!raw) return std::nullopt;
    return Saga<T>{raw->id, raw->version, raw->completed, raw->data.get<T>()};
  }
  std::string schema_;  // validated
};

}  // namespace baton
