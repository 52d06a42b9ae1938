// Built-in handlers for demos, drills, benchmarks and tests (see builtin.h).
#include "builtin/builtin.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <pqxx/pqxx>

namespace builtin {

namespace {

// Sleeps `ms`, waking early on cancellation unless the payload says {"ignore_cancel": true}
// (drills use that to make a deposed leader really attempt its commit).
void sleep_for(baton::JobContext& ctx, int ms) {
  if (ms < 0 || ms > 3'600'000) throw baton::Discard("ms must be 0..3600000");
  const auto payload = ctx.payload();
  const bool ignore_cancel = payload.is_object() && payload.value("ignore_cancel", false);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until && (ignore_cancel || !ctx.cancelled())) {
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        until - std::chrono::steady_clock::now(), std::chrono::milliseconds(10)));
  }
  if (!ignore_cancel && ctx.cancelled()) throw std::runtime_error("cancelled before it finished");
}

int ms_of(const baton::JobContext& ctx) {
  const auto payload = ctx.payload();
  return payload.is_object() ? payload.value("ms", 0) : 0;
}

}  // namespace

namespace {

// One line per write(2) on an O_APPEND file: lines of concurrent runs never interleave.
class RunLog {
 public:
  explicit RunLog(const std::string& path)
      : fd_(path.empty() ? -1
                         : open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) {
    if (!path.empty() && fd_ < 0) {
      throw std::system_error(errno, std::generic_category(), "run log " + path);
    }
  }
  ~RunLog() {
    if (fd_ >= 0) close(fd_);
  }
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  bool enabled() const { return fd_ >= 0; }
  void line(const std::string& text) const {
    const auto s = text + "\n";
    if (write(fd_, s.data(), s.size()) != static_cast<ssize_t>(s.size())) {
      throw std::runtime_error("run log: short write");
    }
  }

 private:
  int fd_;
};

long long now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void register_handlers(baton::Node& node, const std::string& run_log) {
  node.handle("noop", [](baton::JobContext&) {});
  node.handle("sleep", [](baton::JobContext& ctx) { sleep_for(ctx, ms_of(ctx)); });
  node.handle_tx("record_tx",
                 [node_id = node.config().node_id](baton::JobContext& ctx, pqxx::work& tx) {
                   tx.exec_params("INSERT INTO effects (job_id, node, epoch) VALUES ($1, $2, $3)",
                                  ctx.job().id, node_id, ctx.job().epoch);
                   sleep_for(ctx, ms_of(ctx));
                 });
  node.handle("record_ext", [url = node.config().database_url, schema = node.config().schema,
                             node_id = node.config().node_id](baton::JobContext& ctx) {
    // One connection per pool thread, outside the job's transaction: an external effect.
    thread_local std::unique_ptr<pqxx::connection> conn;
    if (!conn) {
      conn = std::make_unique<pqxx::connection>(url);
      pqxx::nontransaction tx(*conn);
      tx.exec("SET search_path TO " + tx.quote_name(schema));
    }
    try {
      pqxx::nontransaction tx(*conn);
      tx.exec_params(
          "INSERT INTO executions (job_id, node, epoch, attempt) VALUES ($1, $2, $3, $4)",
          ctx.job().id, node_id, ctx.job().epoch, ctx.job().attempt);
    } catch (const pqxx::broken_connection&) {
      conn.reset();
      throw;
    }
    const auto payload = ctx.payload();
    if (ctx.job().attempt <= payload.value("fail_attempts", 0)) {
      throw std::runtime_error("failing attempt " + std::to_string(ctx.job().attempt) +
                               " on purpose");
    }
    sleep_for(ctx, ms_of(ctx));
  });
  node.handle("record_run", [log = std::make_shared<RunLog>(run_log),
                             node_id = node.config().node_id](baton::JobContext& ctx) {
    if (!log->enabled()) throw baton::Discard("record_run needs a node started with --run-log");
    const auto& job = ctx.job();
    const auto run = std::to_string(job.id) + " " + std::to_string(job.attempt) + " " +
                     std::to_string(job.epoch) + " " + node_id + " ";
    const auto allowed_us =
        std::chrono::duration_cast<std::chrono::microseconds>(ctx.started_at().time_since_epoch())
            .count();
    log->line("start " + run + std::to_string(now_us()) + " " + std::to_string(allowed_us) + " " +
              ctx.idempotency_key());
    const int ms = ms_of(ctx);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    const auto payload = ctx.payload();
    const auto release = payload.is_object() && payload.contains("until_exists") &&
                                 payload["until_exists"].is_string()
                             ? payload["until_exists"].get<std::string>()
                             : std::string();
    std::error_code missing;
    while (std::chrono::steady_clock::now() < until && !ctx.cancelled() &&
           (release.empty() || !std::filesystem::exists(release, missing))) {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          until - std::chrono::steady_clock::now(), std::chrono::milliseconds(2)));
    }
    const bool cancelled = ctx.cancelled();
    log->line("end " + run + std::to_string(now_us()) + (cancelled ? " cancelled" : " ok"));
    if (cancelled) throw std::runtime_error("cancelled before it finished");
  });
  // Fails with payload.message; with payload.unless_exists, only while that file is missing (an
  // operator fixes the cause, then retries the dead letter).
  node.handle("fail", [](baton::JobContext& ctx) {
    const auto payload = ctx.payload();
    if (payload.is_object() && payload.contains("unless_exists") &&
        payload["unless_exists"].is_string() &&
        std::filesystem::exists(payload["unless_exists"].get<std::string>())) {
      return;
    }
    throw std::runtime_error(payload.is_object() ? payload.value("message", "asked to fail")
                                                 : "asked to fail");
  });
}

}  // namespace builtin
