// The saga store against a real PostgreSQL.
#include <gtest/gtest.h>

#include <thread>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/migrations.h"
#include "support/node_runner.h"
#include "support/support.h"

namespace {

using namespace baton::test;
using baton::Saga;
using baton::SagaStore;

struct Counter {
  static constexpr const char* saga_type = "counter";
  static std::vector<std::string> indexed() { return {"key", "alias"}; }
  std::string key;
  std::string alias;
  int n = 0;
};
void to_json(nlohmann::json& j, const Counter& c) {
  j = {{"key", c.key}, {"n", c.n}};
  if (!c.alias.empty()) j["alias"] = c.alias;
}
void from_json(const nlohmann::json& j, Counter& c) {
  j.at("key").get_to(c.key);
  c.alias = j.value("alias", "");
  j.at("n").get_to(c.n);
}

class Sagas : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = unique_schema(::testing::UnitTest::GetInstance()->current_test_info()->name());
    conn_ = baton::detail::connect({.url = database_url(), .schema = schema_});
    baton::detail::migrate(*conn_, schema_);
    store_ = std::make_unique<SagaStore>(schema_);
  }
  long long count(const std::string& sql) { return query_int(*conn_, sql); }
  std::string create(const std::string& key, int n = 0) {
    pqxx::work tx(*conn_);
    Saga<Counter> s;
    s.data = {key, "", n};
    store_->save(tx, s);
    tx.commit();
    return s.id;
  }
  int value_of(const std::string& key) {
    pqxx::work tx(*conn_);
    return store_->find<Counter>(tx, "key", key)->data.n;
  }
  std::string schema_;
  std::unique_ptr<pqxx::connection> conn_;
  std::unique_ptr<SagaStore> store_;
};

TEST_F(Sagas, ConcurrentJobsForOneSagaNeverLoseAnUpdate) {
  create("shared");
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      try {
        auto conn = baton::detail::connect({.url = database_url(), .schema = schema_});
        for (int i = 0; i < kEach; ++i) {
          pqxx::work tx(*conn);
          auto s = store_->find<Counter>(tx, "key", "shared");  // locks until commit
          ++s->data.n;
          store_->save(tx, *s);
          tx.commit();
        }
      } catch (const std::exception&) {
        ++errors;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(value_of("shared"), kThreads * kEach);
  EXPECT_EQ(count("SELECT version FROM sagas"), kThreads * kEach + 1);
}

TEST_F(Sagas, LookupsByIdAndPropertyAndIndexRowsFollowSaves) {
  const auto id = create("k1", 5);
  {
    pqxx::work tx(*conn_);
    auto by_id = store_->get<Counter>(tx, id);
    ASSERT_TRUE(by_id);
    EXPECT_EQ(by_id->data.n, 5);
    EXPECT_FALSE(store_->find<Counter>(tx, "key", "nope"));
    by_id->data.key = "k2";  // a correlation value changes
    by_id->data.alias = "a";
    store_->save(tx, *by_id);
    tx.commit();
  }
  EXPECT_EQ(count("SELECT count(*) FROM saga_index WHERE value = 'k1'"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM saga_index WHERE property = 'key' AND value = 'k2'"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM saga_index WHERE property = 'alias' AND value = 'a'"), 1);
  {
    pqxx::work tx(*conn_);
    auto s = store_->find<Counter>(tx, "alias", "a");
    ASSERT_TRUE(s);
    store_->complete(tx, *s);
    tx.commit();
  }
  EXPECT_EQ(count("SELECT count(*) FROM saga_index"), 0) << "completion frees the values";
  EXPECT_EQ(count("SELECT count(*) FROM sagas WHERE completed_at IS NOT NULL"), 1)
      << "completed sagas are kept for audit";
  create("k2");  // the value can start a new saga
}

TEST_F(Sagas, AnUnindexedLookupFailsClearlyAndATakenValueConflicts) {
  create("k1");
  pqxx::work tx(*conn_);
  try {
    store_->find<Counter>(tx, "customer", "x");
    ADD_FAILURE() << "looked up an undeclared property";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no indexed property 'customer'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("indexed now: key, alias"), std::string::npos);
  }
  Saga<Counter> twin;
  twin.data = {"k1", "", 0};
  EXPECT_THROW(store_->save(tx, twin), baton::SagaConflict);
}

TEST_F(Sagas, AStaleVersionIsRefused) {
  const auto id = create("k1");
  Saga<Counter> stale;
  {
    pqxx::work tx(*conn_);
    stale = *store_->get<Counter>(tx, id);
    tx.commit();  // loaded outside the transaction that saves: optimistic
  }
  {
    pqxx::work tx(*conn_);
    auto fresh = *store_->get<Counter>(tx, id);
    fresh.data.n = 1;
    store_->save(tx, fresh);
    tx.commit();
  }
  pqxx::work tx(*conn_);
  stale.data.n = 99;
  EXPECT_THROW(store_->save(tx, stale), baton::SagaConflict);
}

TEST_F(Sagas, AFailedHandlerLeavesTheSagaUnchanged) {
  create("k1", 1);
  RunningNode n(test_config(schema_, "solo"), [&](baton::Node& node) {
    node.handle_tx("bump", [&](baton::JobContext&, pqxx::work& tx) {
      auto s = node.sagas().find<Counter>(tx, "key", "k1");
      s->data.n = 1000;
      node.sagas().save(tx, *s);
      throw std::runtime_error("declined after saving");
    });
  });
  baton::Client(database_url(), schema_).enqueue("bump", {}, {.max_attempts = 2});
  ASSERT_TRUE(wait_for([&] { return count("SELECT count(*) FROM dead_jobs") == 1; }, 20s));
  EXPECT_EQ(value_of("k1"), 1);
}

TEST_F(Sagas, AFencedCommitLeavesTheSagaUnchanged) {
  create("k1", 1);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("INSERT INTO jobs (queue, type) VALUES ('q', 'bump')");
    tx.exec(
        "INSERT INTO locks (lock_key, region, client_id, epoch, expires_at) VALUES "
        "('k', 'r', 'old', 1, now() + interval '1 minute')");
  }
  auto jobs = baton::detail::claim_jobs(*conn_, {{"k", "r"}, "old", 1}, 1, {{}, {}, {"bump"}});
  ASSERT_EQ(jobs.size(), 1u);
  {
    pqxx::nontransaction tx(*conn_);
    tx.exec("UPDATE locks SET client_id = 'new', epoch = 2");
  }
  baton::detail::rescue_lost(*conn_, {{"k", "r"}, "new", 2}, {}, std::chrono::seconds(30));
  // The deposed leader's handler saves the saga, then its completion is fenced: roll back.
  pqxx::work tx(*conn_);
  auto s = store_->find<Counter>(tx, "key", "k1");
  s->data.n = 1000;
  store_->save(tx, *s);
  EXPECT_FALSE(baton::detail::complete_in(tx, {jobs[0].job.id, 1, jobs[0].token, 0.1}));
  tx.abort();
  EXPECT_EQ(value_of("k1"), 1);
}

}  // namespace
