// Completer: records job outcomes in the database in batches. Outcomes that arrive while a batch
// is being written form the next batch, so batches grow with load and add no delay when idle, up
// to kMaxWrite outcomes: a backlog is written oldest first in writes of at most that size, so
// that a write's time stays bounded, and a write cut at its deadline is sent again topped up to
// that size at most, not with everything gathered meanwhile.
// A batch that fails on a lost connection is kept and retried after reconnecting: an outcome is
// dropped only at shutdown after the flush deadline, and then its job stays `running` until a
// newer epoch rescues it, so nothing is lost. A batch whose COMMIT lost its answer is sent again
// only if the server says that transaction did not commit: sent again after it did, its
// outcomes would find their jobs gone and be counted as fenced. A batch that PostgreSQL refuses for
// its data is written one outcome at a time, so that one bad outcome never holds up the others.
//
// Thread-safety: add_*() and pending() from any thread; start()/stop() from one owner thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/job_store.h"
#include "baton/detail/observer.h"

namespace baton::worker {

// The outcomes' session, from `connect`: durable commits (synchronous), a statement bound, no
// transaction left open, the completion planned once. The completer's session is so, and so are
// tests that complete as it does.
detail::ConnectOptions completion_session(detail::ConnectOptions connect);

class Completer {
 public:
  // The most outcomes one write (one transaction) carries.
  static constexpr std::size_t kMaxWrite = 5'000;

  Completer(detail::ConnectOptions connect, detail::JobObserver* observer);
  ~Completer();
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  // Before start(): called after a write that carried an outcome whose job's end lets another
  // be claimed (detail::Completion::partitioned, cluster_limited).
  void on_claim_freed(std::function<void()> freed) { claim_freed_ = std::move(freed); }

  void start();
  // Writes what is pending (retrying for up to `deadline`), then stops the thread.
  void stop(Millis deadline);

  // Cuts the write in flight, if any (it is written again on a new connection): at the end of
  // leadership, when the network may have stopped answering.
  void cut_in_flight();

  void add(detail::Completion done);
  void add(detail::Failure failed);
  void add(detail::Release released);
  std::size_t pending() const;
  // Blocks until every outcome added so far is written (or fenced), or the timeout passes.
  bool wait_flushed(Millis timeout);
  // How many outcomes were added so far: a mark for wait_settled().
  std::uint64_t added() const;
  // Blocks until the first `mark` outcomes ever added are written (or fenced, or given up), or
  // the timeout passes; outcomes added later do not delay it (shards: the others go on).
  bool wait_settled(std::uint64_t mark, Millis timeout);

 private:
  void loop();
  // Moves the oldest queued outcomes, up to `n`, onto the batch to write. Under mutex_.
  void take(std::size_t n, std::vector<detail::Completion>& done,
            std::vector<detail::Failure>& failed, std::vector<detail::Release>& released);
  // Writes the outcomes and empties the vectors; throws (leaving what is unwritten) when the
  // connection is lost.
  void write(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
             std::vector<detail::Release>& released);
  // One transaction for all of them.
  void apply(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
             std::vector<detail::Release>& released);
  // One transaction each, for a batch PostgreSQL refused.
  void isolate(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
               std::vector<detail::Release>& released);
  // Before writing again after a COMMIT whose answer was lost: drops from the vectors what that
  // write carried if it committed. Throws while the server cannot tell yet.
  void resolve_doubt(std::vector<detail::Completion>& done, std::vector<detail::Failure>& failed,
                     std::vector<detail::Release>& released);
  std::size_t queued() const { return done_.size() + failed_.size() + released_.size(); }
  // Notifies the jobs channel for each queue, after a write that freed places in them.
  void wake_other_nodes(const std::vector<std::string>& queues);

  const detail::ConnectOptions connect_;
  detail::JobObserver* const observer_;
  std::function<void()> claim_freed_;
  std::unique_ptr<pqxx::connection> conn_;
  bool wake_reported_ = false;  // a failed wake_other_nodes() was logged; the completer thread's
  // The last write whose COMMIT lost its answer: its transaction, and the claims (job id, token)
  // of the outcomes it carried. The completer thread's alone.
  struct Doubt {
    std::string xid;
    std::vector<std::pair<std::int64_t, std::int64_t>> claims;
    std::chrono::steady_clock::time_point since;
  };
  std::optional<Doubt> doubt_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable flushed_cv_;
  // Queues (deques: a write takes from the front, and a backlog after a stall may hold millions).
  std::deque<detail::Completion> done_;
  std::deque<detail::Failure> failed_;
  std::deque<detail::Release> released_;
  // The kind of each queued outcome, in the order they were added: a write takes the oldest, so
  // that wait_settled()'s mark counts a prefix of what was added.
  enum class Kind : std::uint8_t { done, failed, released };
  std::deque<Kind> order_;
  std::size_t in_flight_ = 0;  // taken out of the queues, not yet written
  std::uint64_t added_ = 0;    // outcomes ever added
  std::uint64_t taken_ = 0;    // of them, taken out of the queues
  std::uint64_t settled_ = 0;  // of them, written, fenced or given up (all taken, in order)
  bool stopping_ = false;
  bool exited_ = false;  // the thread left its loop
  std::chrono::steady_clock::time_point stop_deadline_{};
  std::thread thread_;
};

}  // namespace baton::worker
