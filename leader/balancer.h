// Balancer: with shards (docs/concepts.md, "Shards"), decides how many of the deployment's shards
// this node should lead, and keeps it there.
//
// Every node stands for every shard (one Elector each), but leads only its fair share. Each pass
// (every retry interval), on a connection of its own, it reads the live nodes of the deployment
// (a nodes row seen within 5 s, not stopped, with a session open on the server: a killed node
// drops out at once) ordered by start time, and the shard lock rows. With L live nodes and N
// shards, the first N mod L nodes should lead ceil(N / L) shards and the rest floor(N / L); the
// targets add up to N, so the shards spread without talking. may_stand(k) is what shard k's
// elector asks before each attempt:
//   - yes while this node leads fewer shards than its target, for a shard whose advisory lock no
//     session held at the last pass (one attempt at a time, so that two free shards do not both
//     go to a node that needs one);
//   - yes for a shard whose lease has been over for a second (no node took it: the counts were
//     stale), whatever the target;
//   - no while the deployment's shard count differs from this node's (settings.shards changed).
// A node that was asked to step down stands aside for a while: its row says "stepping_down", the
// others count it out, and it counts itself out of their targets too.
// A node over its target hands one shard over (the highest-numbered, shard 0 last) at most every
// 250 ms, gracefully, on a thread of its own (the passes go on meanwhile): its jobs drain, then
// its elector releases the lock and notifies, and a node under its target takes it. A shard whose
// jobs did not drain within the grace stays, and is not tried again for a while.
//
// After each attempt the next elector of a node under its share tries at once (not at its next
// retry), so that a node that must take several shards takes them a round trip apart.
//
// Thread-safety: may_stand()/stood() from the electors' threads (a mutex guards the attempt in
// progress); start()/stop() from the owner thread; the rest is atomics or the loop thread's own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "baton/config.h"
#include "baton/detail/db.h"
#include "baton/detail/lease.h"
#include "baton/detail/waker.h"

namespace baton::leader {

struct BalancerConfig {
  detail::ConnectOptions connect;
  std::string node_id;
  std::string region;
  std::vector<std::string> lock_keys;  // by shard
  std::string node_group;              // shard 0's "<region>/<lock_key>", as nodes rows say
  Millis interval{25};
  Millis hand_over_every{250};
  // After a hand-over that kept its shard, that shard is not handed over again for this long.
  Millis hand_over_retry{10000};
};

struct BalancerHooks {
  // Drains shard k's jobs and releases its lock (blocks until released or failed). False when it
  // kept the shard (its jobs did not drain in time).
  std::function<bool(int shard)> hand_over;
  // A shard came free or this node's share grew: the electors should try now.
  std::function<void()> nudge;
};

class Balancer {
 public:
  // `leases` are this node's, by shard; they must outlive the Balancer.
  Balancer(BalancerConfig config, BalancerHooks hooks, std::vector<const detail::Lease*> leases);
  ~Balancer();
  Balancer(const Balancer&) = delete;
  Balancer& operator=(const Balancer&) = delete;

  void start();
  void stop();
  bool may_stand(int shard);
  // After an attempt may_stand() allowed: the next elector may try at once (a won shard counts
  // as led from now on; a lost one is not tried again before the next pass).
  void stood(int shard, bool won);
  // A step-down: this node stands for nothing for `how_long`, and says so in its nodes row
  // (aside()), so that the others count it out and take its shards at once.
  void stand_aside(Millis how_long);
  bool aside() const;
  // As of the last pass: a session holds shard k's advisory lock and no lease on it is valid (a
  // stranger, or a holder on its way out).
  bool may_be_stranger(int shard) const { return ((held_.load() & ~leased_.load()) >> shard) & 1U; }
  int led() const;
  int target() const { return target_.load(); }

 private:
  void loop();
  void pass(pqxx::connection& conn);

  const BalancerConfig config_;
  const BalancerHooks hooks_;
  const std::vector<const detail::Lease*> leases_;
  const int shards_;
  std::atomic<int> target_;
  std::atomic<bool> count_mismatch_{false};
  std::atomic<std::uint64_t> orphaned_{0};  // bit k: shard k's lease ended over a second ago
  std::atomic<std::uint64_t> held_{0};      // bit k: a session holds shard k's advisory lock
  std::atomic<std::uint64_t> lost_{0};      // bit k: an attempt on shard k lost since the pass
  std::atomic<std::uint64_t> leased_{0};    // bit k: shard k's lock row has a valid lease
  int last_live_ = 0;                       // loop thread only
  // One attempt at a time: the shard trying (-1: none), until stood() or a time limit.
  std::mutex standing_mutex_;
  int standing_ = -1;                // under standing_mutex_
  std::int64_t stand_until_ns_ = 0;  // under standing_mutex_
  std::atomic<std::int64_t> aside_until_ns_{0};
  std::atomic<bool> stopping_{false};
  // Loop thread only:
  std::chrono::steady_clock::time_point next_hand_over_{};
  std::vector<std::chrono::steady_clock::time_point> keep_until_;  // by shard: not handed over
  std::thread hand_over_thread_;
  std::atomic<int> handing_over_{-1};  // the shard being handed over (-1: none)
  std::atomic<int> kept_shard_{-1};    // a shard the last hand-over kept (-1: none)
  detail::Waker waker_;
  std::thread thread_;
};

}  // namespace baton::leader
