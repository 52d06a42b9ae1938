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
  // libpq connection string, URI (postgresql://...) or key=value form. Empty: $DATABASE_URL.
  // Handlers' transactions use it; so do the election and the claims unless
  // election_database_url is set.
  std::string database_url;
  // A direct connection (or a session-mode pool) for the sessions that must stay one server
  // session: the election, claims, outcomes and the leader's services. Set it when database_url
  // goes through a transaction pooler (PgBouncer pool_mode=transaction), which breaks session
  // advisory locks, LISTEN and session settings. Empty: database_url.
  std::string election_database_url;
  // Schema holding baton's tables: [a-z_][a-z0-9_]{0,55} (its channels <schema>_jobs and
  // <schema>_leader must fit PostgreSQL's 63-byte names).
  std::string schema = "baton";
  // A name for the deployment in metrics: every family carries deployment="<cluster>/<schema>"
  // (just "<schema>" when empty), so one Prometheus can watch several deployments.
  std::string cluster;
  // This node's name in the lock row, the nodes table and application_name. Default host:pid.
  std::string node_id;
  // Handler threads of the leader's pool: the most jobs it runs at once. Fewer run while the
  // jobs keep their threads' CPU busy (about one per core; see worker/executor.h).
  int threads = 16;
  // Queues this node consumes; empty means every queue.
  std::vector<std::string> queues;
  // Most jobs of a queue running at once on the leader, e.g. {{"emails", 4}}; others share
  // the pool freely.
  std::map<std::string, int> queue_concurrency;
  // host:port of /metrics, e.g. 127.0.0.1:9464 (port 0 picks a free one); "off" disables it.
  std::string metrics_listen = "127.0.0.1:9464";
  // The operator console (docs/console.md): host:port of its pages, or "off" (the default).
  // Beyond a loopback address it needs console_token_file.
  std::string console_listen = "off";
  // A file whose first line is the console's token (16 characters or more): requests must
  // carry it (Authorization: Bearer, or basic auth with any user name and the token as
  // password). Empty: no token, allowed only on a loopback address.
  std::string console_token_file;
  // The console shows everything and changes nothing.
  bool console_read_only = false;
  // The console's database role, when it should not be the node's (an operator's role, whose
  // grants allow pausing queues and step-down requests). Empty: database_url.
  std::string console_database_url;
  // Apply pending migrations at start (under an advisory lock; a no-op when current).
  bool migrate = true;
  // Most jobs one claim statement takes, and most claimed jobs kept waiting for a thread. Below
  // this cap the claim adapts: one job per free thread, plus a buffer of about 100 ms of work
  // (none for slow jobs) whose payloads stay under 64 MiB.
  int batch_size = 1000;
  // How often the leader polls when no NOTIFY arrives.
  Millis poll_interval{1000};
  // While jobs stream in (two rounds of claims in a row found jobs, the second more than one, and
  // no claim of the round took all it asked for), the leader waits this long before its next
  // claim, so that one claim takes what arrived meanwhile: fewer, fuller claims, for at most this
  // much more waiting per job under such a stream. The first claim after the leader wakes never
  // waits. 0: claim again at once. At most 100 ms; a gather longer than poll_interval is cut to
  // it.
  Millis claim_gather{5};

  // Election (leader/): the lock row is (lock_key, region).
  std::string lock_key = "baton-leader";
  std::string region = "default";
  // Partitioned leadership (docs/concepts.md, "Shards"): the deployment's jobs fall into this many
  // shards, each led by one node at a time with its own lock row ("<lock_key>:<k>" for k > 0),
  // epoch and fencing; a node leads its fair share of them. 1: one leader, as without shards.
  // Every node of a deployment gives the same count (the database keeps it: settings.shards).
  int shards = 1;
  //
  // The lease (docs/concepts.md, "Lease ordering"). lock_ttl is the lease on the database's side:
  // the lock row expires this long after a renewal (a follower may then evict the holder), and
  // the server ends an election session silent this long (idle_session_timeout), which frees the
  // lock. The leader's own lease, on its steady clock from the send time of its last successful
  // renewal, is shorter by a margin: local_lease() = lock_ttl * (1 - 1 %) - lease_margin. At its
  // end the leader stops starting jobs, cancels running ones and reports baton_leader 0, before
  // the database can let another node lead.
  Millis lock_ttl{500};
  Millis lease_margin{100};      // for scheduling delay (a thread woken late, a slow renewal)
  Millis renew_interval{100};    // at most local_lease() / 3: two renewals may fail
  Millis retry_interval{25};     // how often a follower tries the lock (a tiny query each)
  Millis shutdown_grace{10000};  // how long SIGTERM waits for in-flight jobs

  // Finished jobs stay in job_history this long; the leader prunes older rows in small batches.
  Millis history_retention{7LL * 24 * 3600 * 1000};

  // Retries: delay = min(retry_cap, retry_base * 2^(attempt-1)), with jitter in [50 %, 100 %].
  Millis retry_base{1000};
  Millis retry_cap{3600 * 1000};

  // Node::run() turns the first SIGTERM/SIGINT into a graceful stop, the second into an abandon.
  bool handle_signals = true;

  // Throws ConfigError naming the first bad setting. Fills node_id when empty, and database_url
  // from $DATABASE_URL when empty.
  void validate();

  // The leader's own lease: lock_ttl less the clock-rate allowance (1 %) and lease_margin.
  Millis local_lease() const;

  // "<cluster>/<schema>", or "<schema>" without a cluster name: the metrics' deployment label.
  std::string deployment() const { return cluster.empty() ? schema : cluster + "/" + schema; }
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
