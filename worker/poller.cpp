// Poller: leader-gated claiming (see poller.h).
#include "worker/poller.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

namespace baton::worker {
namespace {

struct WakeReceiver : pqxx::notification_receiver {
  using pqxx::notification_receiver::notification_receiver;
  void operator()(const std::string&, int) override {}
};

}  // namespace

Poller::Poller(PollerConfig config, Executor& executor, detail::JobObserver* observer,
               std::function<bool(std::int64_t)> still_leading)
    : config_(std::move(config)),
      executor_(executor),
      observer_(observer),
      still_leading_(std::move(still_leading)) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

Poller::~Poller() {
  stop();
  receiver_.reset();
  conn_.reset();
  close(wake_fd_);
}

void Poller::start(std::int64_t epoch) {
  stop();
  stopping_.store(false);
  thread_ = std::thread([this, epoch] { loop(epoch); });
}

void Poller::stop() {
  stopping_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
}

void Poller::wake() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
}

void Poller::wait(Millis timeout) {
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {conn_ ? conn_->sock() : -1, POLLIN, 0}};
  poll(fds, conn_ ? 2 : 1, static_cast<int>(timeout.count()));
  std::uint64_t drained = 0;
  [[maybe_unused]] auto n = read(wake_fd_, &drained, sizeof drained);
}

int Poller::buffer_size() const {
  // A buffered job waits for one of the threads to finish: about position * run time / threads.
  // Keep that under 100 ms; no buffer until a job's run time is known.
  constexpr double kMaxWaitSeconds = 0.1;
  const double run = executor_.mean_run_seconds();
  if (run <= 0) return 0;
  const double fits = executor_.threads() * kMaxWaitSeconds / std::max(run, 1e-6);
  return static_cast<int>(std::min<double>(config_.batch_size, fits));
}

bool Poller::claim_round(std::int64_t epoch) {
  bool more = false;  // some claim came back full: more jobs may be waiting
  auto claim = [&](int want, const std::vector<std::string>& queues,
                   const std::vector<std::string>& except) {
    if (want <= 0 || !still_leading_(epoch)) return;
    auto jobs =
        detail::claim_jobs(*conn_, config_.lock, config_.node_id, epoch, want, queues, except);
    more = more || jobs.size() == static_cast<std::size_t>(want);
    for (auto& j : jobs)
      executor_.submit(std::move(j));
  };
  // Queues with a concurrency limit first, each claimed up to its own free slots; then the rest.
  const int buffer = buffer_size();
  executor_.set_refill_mark(buffer / 2);
  int room = executor_.free_slots() + buffer;
  std::vector<std::string> limited;
  for (const auto& [queue, limit] : config_.queue_limits) {
    if (!config_.queues.empty() &&
        std::find(config_.queues.begin(), config_.queues.end(), queue) == config_.queues.end()) {
      continue;
    }
    limited.push_back(queue);
    claim(std::min({room, limit - executor_.busy_in(queue), config_.batch_size}), {queue}, {});
    room = executor_.free_slots() + buffer;
  }
  std::vector<std::string> rest;
  for (const auto& q : config_.queues) {
    if (config_.queue_limits.count(q) == 0) rest.push_back(q);
  }
  if (config_.queues.empty() || !rest.empty()) {
    claim(std::min(room, config_.batch_size), rest, limited);
  }
  return more && executor_.free_slots() + buffer > 0;
}

void Poller::loop(std::int64_t epoch) {
  bool reported = false;
  Millis backoff{50};
  while (!stopping_.load()) {
    try {
      if (!conn_) {
        conn_ = detail::connect(config_.connect);
        // A claim need not wait for its WAL flush: the first outcome of any claimed job commits
        // synchronously and so flushes the claim's earlier WAL with it. A crash that loses a
        // claim only leaves its job available (it runs again, as after any crash); its outcome
        // could not have committed without it.
        pqxx::nontransaction(*conn_).exec("SET synchronous_commit = off");
        receiver_ =
            std::make_unique<WakeReceiver>(*conn_, detail::jobs_channel(config_.connect.schema));
      }
      const bool more = claim_round(epoch);
      if (reported) spdlog::info("poller: database reachable again");
      reported = false;
      backoff = Millis(50);
      if (more) continue;
      // A NOTIFY that arrived during the claim is already read off the socket: poll() would
      // not see it.
      if (conn_->get_notifs() > 0) continue;
      wait(config_.poll_interval);
      conn_->get_notifs();
    } catch (const std::exception& e) {
      receiver_.reset();
      conn_.reset();
      if (observer_ != nullptr) observer_->database_error("poller");
      if (!reported) {
        spdlog::error("poller: {}; retrying with backoff", detail::scrub(e.what()));
        reported = true;
      }
      wait(backoff);
      backoff = std::min(backoff * 2, Millis(2000));
    }
  }
}

}  // namespace baton::worker
