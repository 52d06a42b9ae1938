// History's finished_at index (a BRIN index, sql/0018) through pruning: new history that fills
// the pages of pruned rows must not make every later prune read those pages. Real PostgreSQL,
// the node's own pruner.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "baton/detail/migrations.h"
#include "support/node_runner.h"
#include "support/roles.h"
#include "support/schema_test.h"
#include "support/support.h"

namespace {

using namespace baton::test;

class History : public SchemaTest {
 protected:
  void SetUp() override {
    SchemaTest::SetUp();
    // No vacuum but the test's own: one that held the index would put the prune off a tick.
    pqxx::nontransaction(*db_).exec("ALTER TABLE job_history SET (autovacuum_enabled = false)");
  }
  // Rows [from, to] of history, finished `age` ago.
  void add_history(int from, int to, const std::string& age) {
    pqxx::nontransaction(*db_).exec(
        "INSERT INTO job_history (id, queue, type, payload, priority, attempts, created_at, "
        "run_at, finished_at, outcome) SELECT i, 'q', 't', '{}', 0, 1, now(), now(), now() - "
        "interval '" +
        age + "', 'completed' FROM generate_series(" + std::to_string(from) + ", " +
        std::to_string(to) + ") i");
  }
  // The heap pages a prune's lookup (rows finished more than an hour ago) reads through the
  // index: a range whose summary matches is read whole.
  long long prune_reads() {
    pqxx::work tx(*db_);
    tx.exec("SET LOCAL enable_seqscan = off");
    std::string plan;
    for (const auto& row : tx.exec("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT ctid FROM "
                                   "job_history WHERE finished_at < now() - interval '1 hour'"))
      plan += std::string(row[0].c_str()) + "\n";
    EXPECT_NE(plan.find("job_history_finished_idx"), std::string::npos) << plan;
    long long pages = 0;
    const std::regex heap(R"((lossy|exact)=(\d+))");
    const auto line = plan.find("Heap Blocks:");
    if (line == std::string::npos) return 0;  // no page read
    const auto text = plan.substr(line, plan.find('\n', line) - line);
    for (std::sregex_iterator m(text.begin(), text.end(), heap), end; m != end; ++m)
      pages += std::stoll((*m)[2].str());
    return pages;
  }
  long long pages_of_history() {
    return count("SELECT pg_relation_size('job_history') / current_setting('block_size')::bigint");
  }
  // How many of history's rows with ids in [from, to] lie in pages before the first of the rows
  // with ids from 20,001 to 21,000 (the table's end when the test began).
  long long rows_in_reused_pages(int from, int to) {
    return count(
        "SELECT count(*) FROM job_history WHERE id BETWEEN " + std::to_string(from) + " AND " +
        std::to_string(to) +
        " AND (ctid::text::point)[0] < (SELECT min((ctid::text::point)[0]) FROM job_history "
        "WHERE id BETWEEN 20001 AND 21000)");
  }
  // Vacuums history until the vacuum leaves no dead row behind: other tests' transactions on
  // this database hold snapshots for moments, and a row one of them may still see stays. Then the
  // pages of the pruned rows are free. The vacuum leaves the index alone (INDEX_CLEANUP OFF), so
  // that none summarizes a range here.
  bool free_pruned_pages() {
    return wait_for(
        [&] {
          pqxx::nontransaction(*db_).exec("VACUUM (INDEX_CLEANUP OFF) job_history");
          return count(
                     "SELECT n_dead_tup FROM pg_stat_all_tables WHERE relid = "
                     "'job_history'::regclass") == 0;
        },
        std::chrono::seconds(30), std::chrono::milliseconds(100));
  }
  // 20,000 rows two hours old, then 1,000 ten minutes old (they keep the table's end, as live
  // history does), the ranges summarized, as a tick or a vacuum leaves them. Returns the pages.
  long long old_and_recent_history() {
    add_history(1, 20000, "2 hours");
    add_history(20001, 21000, "10 minutes");
    count("SELECT brin_summarize_new_values('job_history_finished_idx')");
    return pages_of_history();
  }
  // The pruner deletes the old rows, and its next tick summarizes their ranges (without the
  // sweep) while a reader's snapshot still sees the deleted rows.
  void prune_and_summarize_while_a_reader_sees_the_rows() {
    auto reader = connect(schema_);
    pqxx::work snapshot(*reader, "reader");
    snapshot.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    ASSERT_EQ(snapshot.exec("SELECT count(*) FROM job_history")[0][0].as<long long>(), 21000);
    prune_with_a_node();
    EXPECT_EQ(count("SELECT summarize_history(0, 0)"), 0);
    snapshot.commit();
  }
  // A vacuum frees the pruned rows' pages, and 20,000 new rows fill them.
  void refill_pruned_pages() {
    ASSERT_TRUE(free_pruned_pages()) << "a vacuum still left dead rows after 30 s";
    add_history(21001, 41000, "0 seconds");
    ASSERT_GE(rows_in_reused_pages(21001, 41000), 18000) << "the new rows did not reuse the pages";
  }
  void prune_with_a_node() {
    auto config = test_config(schema_, "pruner");
    config.history_retention = std::chrono::hours(1);
    RunningNode n(config, [](baton::Node&) {});
    ASSERT_TRUE(wait_count("SELECT count(*) FROM job_history", 1000, std::chrono::seconds(30)))
        << count("SELECT count(*) FROM job_history") << " rows left";
  }
};

// Old and recent history; the pruner deletes the old rows, a vacuum frees their pages, and
// 20,000 new rows fill them.
TEST_F(History, NewRowsInPrunedPagesDoNotMakeThePruneReadThem) {
  const auto pages = old_and_recent_history();
  ASSERT_GE(pages, 128) << "too few pages for several ranges of 32";
  ASSERT_GE(prune_reads(), pages / 2) << "the old rows should be found by the index";

  prune_with_a_node();
  EXPECT_GE(count("SELECT count(*) FROM history_pruned_ranges"), pages / 2 / 32)
      << "the prune should record the ranges it deleted from";
  ASSERT_NO_FATAL_FAILURE(refill_pruned_pages());

  // Nothing is older than an hour now, but until the recorded ranges are summarized again their
  // summaries keep the pruned rows' time, and the lookup reads them whole.
  const auto wide = prune_reads();
  EXPECT_GE(wide, pages / 2) << "the ranges should still carry the pruned rows' time";
  // What the pruner's next tick calls first, here without the sweep.
  EXPECT_EQ(count("SELECT summarize_history(0, 0)"), 0);
  EXPECT_LE(prune_reads(), 32) << "of " << pages_of_history() << " pages, " << wide << " before";
  EXPECT_EQ(count("SELECT count(*) FROM history_pruned_ranges WHERE NOT again"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM job_history"), 21000);
}

// A snapshot that still saw the deleted rows when the next tick summarized their ranges kept
// their time in the summaries; the second summary, an hour after the delete, narrows them.
TEST_F(History, TheSecondSummaryNarrowsARangeAnOldSnapshotKeptWide) {
  const auto pages = old_and_recent_history();
  ASSERT_NO_FATAL_FAILURE(prune_and_summarize_while_a_reader_sees_the_rows());
  ASSERT_NO_FATAL_FAILURE(refill_pruned_pages());
  const auto wide = prune_reads();
  ASSERT_GE(wide, pages / 2) << "the summaries did not keep the deleted rows' time";
  // A tick within the hour leaves them: each range is summarized twice, not every tick.
  EXPECT_EQ(count("SELECT summarize_history(0, 0)"), 0);
  EXPECT_GE(prune_reads(), pages / 2);
  ASSERT_GT(count("SELECT count(*) FROM history_pruned_ranges WHERE again"), 0);
  pqxx::nontransaction(*db_).exec(
      "UPDATE history_pruned_ranges SET pruned_at = pruned_at - interval '61 minutes'");
  EXPECT_EQ(count("SELECT summarize_history(0, 0)"), 0);
  EXPECT_LE(prune_reads(), 32) << "of " << pages_of_history() << " pages, " << wide << " before";
  EXPECT_EQ(count("SELECT count(*) FROM history_pruned_ranges"), 0) << "an hour on, forgotten";
}

// While a vacuum (or ANALYZE, or CREATE INDEX CONCURRENTLY) holds history, the pruner's tick
// cannot summarize, and still deletes; the ranges wait in the record.
TEST_F(History, ThePrunerDeletesWhileAVacuumHoldsHistory) {
  add_history(1, 3000, "2 hours");
  auto holder = connect(schema_);
  pqxx::work hold(*holder);
  hold.exec("LOCK TABLE job_history IN SHARE UPDATE EXCLUSIVE MODE");
  auto config = test_config(schema_, "pruner");
  config.history_retention = std::chrono::hours(1);
  RunningNode n(config, [](baton::Node&) {});
  EXPECT_TRUE(wait_count("SELECT count(*) FROM job_history", 0, std::chrono::seconds(30)))
      << count("SELECT count(*) FROM job_history") << " rows left";
  EXPECT_GT(count("SELECT count(*) FROM history_pruned_ranges WHERE NOT again"), 0);
  hold.commit();
}

// A summary that fails (here: its function raises) does not stop the deletes; the tick counts
// as failed, where operators look for a failing pruner.
TEST_F(History, ASummaryThatFailsLeavesTheDeletesRunningAndIsCounted) {
  add_history(1, 3000, "2 hours");
  pqxx::nontransaction(*db_).exec(
      "CREATE OR REPLACE FUNCTION summarize_history(p_from bigint, p_ranges integer) RETURNS "
      "bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = " +
      schema_ + ", pg_temp AS $$ BEGIN RAISE EXCEPTION 'no summary today'; END $$");
  auto config = test_config(schema_, "pruner");
  config.history_retention = std::chrono::hours(1);
  config.metrics_listen = "127.0.0.1:0";
  RunningNode n(config, [](baton::Node&) {});
  EXPECT_TRUE(wait_count("SELECT count(*) FROM job_history", 0, std::chrono::seconds(30)))
      << count("SELECT count(*) FROM job_history") << " rows left";
  std::string page;
  EXPECT_TRUE(wait_for(
      [&] {
        page = scrape(n.node().metrics_address());
        return metric_sum(page, "baton_database_errors_total{component=\"pruner\"}") >= 1;
      },
      std::chrono::seconds(30)))
      << page;
}

// The pruner's tick summarizes first what the ticks before it pruned.
TEST_F(History, ThePrunersNextTickSummarizesTheRangesItPruned) {
  add_history(1, 20000, "2 hours");
  add_history(20001, 21000, "10 minutes");
  prune_with_a_node();
  ASSERT_GT(count("SELECT count(*) FROM history_pruned_ranges"), 0);
  auto config = test_config(schema_, "pruner-again");
  config.history_retention = std::chrono::hours(1);
  RunningNode n(config, [](baton::Node&) {});
  EXPECT_TRUE(wait_count("SELECT count(*) FROM history_pruned_ranges WHERE NOT again", 0,
                         std::chrono::seconds(30)))
      << "the next tick did not summarize the pruned ranges";
}

// A transaction open while the pruner's next tick summarized the pruned ranges could still see
// the deleted rows, so their time stayed in the summaries. The pruner's sweep summarizes every
// range again, a few each tick, from what is left in it.
TEST_F(History, TheSweepNarrowsARangeSummarizedWhileATransactionSawItsDeletedRows) {
  const auto pages = old_and_recent_history();
  ASSERT_NO_FATAL_FAILURE(prune_and_summarize_while_a_reader_sees_the_rows());
  ASSERT_NO_FATAL_FAILURE(refill_pruned_pages());
  const auto wide = prune_reads();
  ASSERT_GE(wide, pages / 2) << "the summaries did not keep the deleted rows' time";

  // The sweep goes through the table in calls of a few ranges, then starts again from 0.
  long long from = 0;
  int calls = 0;
  do {
    from = count("SELECT summarize_history(" + std::to_string(from) + ", 4)");
    ++calls;
  } while (from != 0 && calls < 1000);
  EXPECT_GE(calls, 2) << "four ranges a call cannot cover " << pages << " pages at once";
  EXPECT_LE(prune_reads(), 32) << "of " << pages_of_history() << " pages, " << wide
                               << " before the sweep";
}

// A session holding history as a vacuum does (SHARE UPDATE EXCLUSIVE) does not stop the prune;
// the summaries say they waited (NULL) at once, rather than after the vacuum, and are made at a
// later call.
TEST_F(History, APruneGoesOnWhileAVacuumHoldsHistoryAndTheSummariesWait) {
  add_history(1, 100, "2 hours");
  auto holder = connect(schema_);
  {
    pqxx::work hold(*holder);
    hold.exec("LOCK TABLE job_history IN SHARE UPDATE EXCLUSIVE MODE");
    EXPECT_EQ(count("SELECT prune_history(3600000, 1000)"), 100);
    EXPECT_EQ(count("SELECT count(*) FROM job_history"), 0);
    EXPECT_EQ(count("SELECT count(*) FROM history_pruned_ranges"), 1);
    EXPECT_EQ(count("SELECT count(*) FROM (SELECT summarize_history(1, 4) AS s) r WHERE s IS NULL"),
              1)
        << "a summary call that meets the lock should say so at once";
    EXPECT_EQ(count("SELECT count(*) FROM history_pruned_ranges"), 1);
    hold.commit();
  }
  EXPECT_EQ(count("SELECT summarize_history(1, 4)"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM history_pruned_ranges WHERE NOT again"), 0);
}

// The schema's owner need not be a superuser: the two functions run with its rights, which
// must be enough to delete history, record the ranges, and summarize the index (PostgreSQL lets
// only the index's owner summarize it). The tests above migrate as a superuser. Here an owner
// role without superuser migrates, and a node's role under the documented grants prunes.
TEST(HistoryOwner, AnOwnerThatIsNotASuperuserPrunesAndSummarizesForANodeRole) {
  const std::string schema = unique_schema("history_owner");
  const auto owner = role_name(schema, "owner");
  const auto node = role_name(schema, "node");
  auto admin = connect("public");
  {
    pqxx::nontransaction tx(*admin);
    for (const auto& r : {owner, node})
      tx.exec("CREATE ROLE " + tx.quote_name(r) + " LOGIN");
    const auto db = tx.exec("SELECT current_database()")[0][0].as<std::string>();
    tx.exec("GRANT CREATE ON DATABASE " + tx.quote_name(db) + " TO " + tx.quote_name(owner));
  }
  auto as_owner = connect(schema, url_as(owner));
  baton::detail::migrate(*as_owner, schema);
  {
    pqxx::nontransaction tx(*as_owner);
    ASSERT_FALSE(
        tx.exec("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0][0].as<bool>());
    tx.exec(documented_block("security.md", "grants", "baton_node", schema, node));
    tx.exec(
        "INSERT INTO job_history (id, queue, type, payload, priority, attempts, created_at, "
        "run_at, finished_at, outcome) SELECT i, 'q', 't', '{}', 0, 1, now(), now(), now() - "
        "CASE WHEN i <= 100 THEN interval '2 hours' ELSE interval '1 minute' END, "
        "'completed' FROM generate_series(1, 110) i");
  }
  auto as_node = connect(schema, url_as(node));
  {
    pqxx::nontransaction tx(*as_node);
    EXPECT_EQ(tx.exec("SELECT prune_history(3600000, 1000)")[0][0].as<long long>(), 100);
    EXPECT_EQ(tx.exec("SELECT summarize_history(0, 4)")[0][0].as<long long>(), 0);
  }
  pqxx::nontransaction tx(*as_owner);
  EXPECT_EQ(tx.exec("SELECT count(*) FROM job_history")[0][0].as<int>(), 10);
  EXPECT_EQ(tx.exec("SELECT count(*) FROM history_pruned_ranges WHERE NOT again")[0][0].as<int>(),
            0)
      << "the pruned ranges were not summarized";
}

}  // namespace
