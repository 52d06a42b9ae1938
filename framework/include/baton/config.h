// Settings of a baton node, each with its default beside it, and the parsers the binaries share.
// A NodeConfig is a plain value: copy it freely; validate() before use (Node does it for you).
#pragma once

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

using Millis = std::chrono::milliseconds;

// Thrown for a bad setting. The message names the setting, the value and the accepted form.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct NodeConfig {
  // libpq connection string, URI (postgresql://...) or key=value form. Required.
  std::string database_url;
  // Schema holding baton's tables: [a-z_][a-z0-9_]{0,62}.
  std::string schema = "baton";
  // This node's name in the lock row, the nodes table and application_name. Default host:pid.
  std::string node_id;
  // Handler threads of the leader's pool.
  int threads = 8;
  // Queues this node consumes; empty means every queue.
  std::vector<std::string> queues;
  // Most jobs of a queue running at once on the leader, e.g. {{"emails", 4}}; others share
  // the pool freely.
  std::map<std::string, int> queue_concurrency;
  // host:port of /metrics, e.g. 127.0.0.1:9464 (port 0 picks a free one); "off" disables it.
  std::string metrics_listen = "127.0.0.1:9464";
  // Apply pending migrations at start (under an advisory lock; a no-op when current).
  bool migrate = true;
  // Most jobs one claim statement takes, and most claimed jobs kept waiting for a thread. The
  // wait is sized from the jobs' run time to about 100 ms, so slow jobs get no buffer; raise
  // this for short jobs with small payloads (bench/ uses 1000).
  int batch_size = 100;
  // How often the leader polls when no NOTIFY arrives.
  Millis poll_interval{1000};

  // Election (leader/): the lock row is (lock_key, region).
  std::string lock_key = "baton-leader";
  std::string region = "default";
  Millis lock_ttl{2000};         // a lease not renewed for this long is lost
  Millis renew_interval{200};    // must be under lock_ttl / 3
  Millis retry_interval{100};    // how often a follower tries to take the lock
  Millis shutdown_grace{10000};  // how long SIGTERM waits for in-flight jobs

  // Finished jobs stay in job_history this long; the leader prunes older rows in small batches.
  Millis history_retention{7LL * 24 * 3600 * 1000};

  // Retries: delay = min(retry_cap, retry_base * 2^(attempt-1)), with jitter in [50 %, 100 %].
  Millis retry_base{1000};
  Millis retry_cap{3600 * 1000};

  // Node::run() turns the first SIGTERM/SIGINT into a graceful stop, the second into an abandon.
  bool handle_signals = true;

  // Throws ConfigError naming the first bad setting. Fills node_id when empty.
  void validate();
};

// Parses "250ms", "2s", "1.5s", "3m", "1h" (a bare number is refused: units are required).
// Throws ConfigError mentioning `setting` when the text is not such a duration.
Millis parse_duration(std::string_view text, std::string_view setting);

// The connection string as given, with any password replaced by ********.
std::string redact_database_url(const std::string& url);

// The connection string without its password, for logs: "host=... port=... dbname=... user=...".
// Throws ConfigError when libpq cannot parse it.
std::string describe_database_url(const std::string& url);

}  // namespace baton
