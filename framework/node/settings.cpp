// Settings from flags, environment, a TOML file and defaults (see baton/settings.h).
#include "baton/settings.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include <toml++/toml.h>

#include "baton/client.h"
#include "baton/detail/schedule.h"
#include "baton/logging.h"
#include "baton/node.h"

namespace baton {
namespace {

// One setting: its name (flag --name, TOML key `name`, environment BATON_NAME), its help, how a
// text value is parsed and stored (throws ConfigError), and how the effective value is shown.
struct Setting {
  std::string name;
  std::string help;
  std::function<void(const std::string&)> apply;
  std::function<std::string()> show;
  bool flag = false;  // also a bare --name, meaning true
};

std::string env_name(const std::string& name) {
  std::string e = "BATON_";
  for (char c : name)
    e += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

int parse_int(const std::string& name, const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < -2'000'000'000 || value > 2'000'000'000) {
    throw ConfigError(name + ": '" + text + "' is not a whole number");
  }
  return static_cast<int>(value);
}

bool parse_bool(const std::string& name, const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  throw ConfigError(name + ": '" + text + "' is not true or false");
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string ms_text(Millis d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return toml_string(std::to_string(ms / 3'600'000) + "h");
  if (ms != 0 && ms % 60'000 == 0) return toml_string(std::to_string(ms / 60'000) + "m");
  if (ms != 0 && ms % 1000 == 0) return toml_string(std::to_string(ms / 1000) + "s");
  return toml_string(std::to_string(ms) + "ms");
}

// A TOML value as the text a flag would carry; `where` names the file and key for messages.
std::string toml_text(const std::string& where, const toml::node& node) {
  if (auto s = node.value_exact<std::string>()) return *s;
  if (auto i = node.value_exact<std::int64_t>()) return std::to_string(*i);
  if (auto b = node.value_exact<bool>()) return *b ? "true" : "false";
  if (auto d = node.value_exact<double>()) {
    std::ostringstream out;
    out << *d;
    return out.str();  // a whole-number setting refuses it with its own message
  }
  std::string out;
  if (const auto* arr = node.as_array()) {
    for (const auto& item : *arr)
      out += (out.empty() ? "" : ",") + toml_text(where, item);
    return out;
  }
  if (const auto* table = node.as_table()) {
    for (const auto& [k, v] : *table)
      out += (out.empty() ? "" : ",") + std::string(k.str()) + "=" + toml_text(where, v);
    return out;
  }
  throw ConfigError(where + " is a TOML date or time; give a string, number or boolean");
}

}  // namespace

struct Settings::Impl {
  std::string description;
  NodeConfig node;
  std::string log_level = "info";
  std::string log_format = "text";
  std::vector<std::string> schedules;
  std::vector<Setting> table;
  std::vector<Setting> extra;  // the application's

  void build_table();
  // Checks a --schedule value and splits it: name, options, spec (and time zone for cron).
  struct Schedule {
    std::string name;
    ScheduleOptions options;
    std::string spec;
    std::string tz = "UTC";
    bool every = false;
  };
  static Schedule parse_schedule(const std::string& text);
};

void Settings::Impl::build_table() {
  auto& c = node;
  auto duration = [](const std::string& name, Millis& field, const std::string& help) {
    return Setting{name, help,
                   [&field, name](const std::string& v) { field = parse_duration(v, name); },
                   [&field] { return ms_text(field); }};
  };
  auto text = [](const std::string& name, std::string& field, const std::string& help) {
    return Setting{name, help, [&field](const std::string& v) { field = v; },
                   [&field] { return toml_string(field); }};
  };
  auto number = [](const std::string& name, int& field, const std::string& help) {
    return Setting{name, help, [&field, name](const std::string& v) { field = parse_int(name, v); },
                   [&field] { return std::to_string(field); }};
  };
  table = {
      {"database-url", "libpq connection string, URI or key=value (also $DATABASE_URL)",
       [&c](const std::string& v) { c.database_url = v; },
       [&c] { return toml_string(redact_database_url(c.database_url)); }},
      {"election-database-url",
       "a direct connection (or session-mode pool) for the election, claims and outcomes, when "
       "database-url goes through a transaction pooler (default: database-url)",
       [&c](const std::string& v) { c.election_database_url = v; },
       [&c] { return toml_string(redact_database_url(c.election_database_url)); }},
      text("schema", c.schema, "schema holding baton's tables"),
      text("cluster", c.cluster,
           "a name for this deployment in metrics (label deployment=<cluster>/<schema>)"),
      {"node-id", "this node's name (default: host:pid of the running process)",
       [&c](const std::string& v) { c.node_id = v; }, [&c] { return toml_string(c.node_id); }},
      number("threads", c.threads, "handler threads"),
      {"queues", "comma-separated queues to consume (default: all)",
       [&c](const std::string& v) { c.queues = split(v); },
       [&c] {
         std::string out;
         for (const auto& q : c.queues)
           out += (out.empty() ? "" : ",") + toml_string(q);
         return "[" + out + "]";
       }},
      {"queue-concurrency", "per-queue limits of jobs running at once: queue=N,queue=N",
       [&c](const std::string& v) {
         c.queue_concurrency.clear();
         for (const auto& item : split(v)) {
           const auto eq = item.find('=');
           if (eq == std::string::npos) {
             throw ConfigError("queue-concurrency: '" + item + "' is not queue=N (e.g. emails=4)");
           }
           c.queue_concurrency[item.substr(0, eq)] =
               parse_int("queue-concurrency", item.substr(eq + 1));
         }
       },
       [&c] {
         std::string out;
         for (const auto& [q, n] : c.queue_concurrency)
           out += (out.empty() ? "" : ", ") + q + " = " + std::to_string(n);
         return "{ " + out + " }";
       }},
      text("metrics-listen", c.metrics_listen, "host:port for /metrics (port 0: any), or off"),
      text("console-listen", c.console_listen,
           "host:port for the operator console (port 0: any), or off"),
      text("console-token-file", c.console_token_file,
           "file holding the console's token (required beyond loopback)"),
      {"console-read-only", "the console shows everything and changes nothing (true/false)",
       [&c](const std::string& v) { c.console_read_only = parse_bool("console-read-only", v); },
       [&c] { return std::string(c.console_read_only ? "true" : "false"); }, true},
      {"console-database-url",
       "the console's database role, e.g. an operator's (default: database-url)",
       [&c](const std::string& v) { c.console_database_url = v; },
       [&c] { return toml_string(redact_database_url(c.console_database_url)); }},
      {"migrate", "apply pending migrations at start (true/false)",
       [&c](const std::string& v) { c.migrate = parse_bool("migrate", v); },
       [&c] { return std::string(c.migrate ? "true" : "false"); }},
      number("batch-size", c.batch_size,
             "most jobs one claim takes, and most claimed jobs waiting for a thread"),
      duration("poll-interval", c.poll_interval, "poll when no NOTIFY arrives"),
      duration("claim-gather", c.claim_gather,
               "while jobs stream in, wait this long between claims so that each takes more "
               "(0ms: claim again at once)"),
      text("lock-key", c.lock_key, "lock row key"),
      number("shards", c.shards,
             "shards of the deployment's jobs, each led by one node (1: one leader; the same on "
             "every node)"),
      text("region", c.region, "lock row region"),
      duration("lock-ttl", c.lock_ttl,
               "the lease on the database's side: a silent leader's session ends, and its row "
               "expires, this long after its last renewal"),
      duration("lease-margin", c.lease_margin,
               "how much sooner the leader's own lease ends (lock-ttl x 0.99 - lease-margin)"),
      duration("renew-interval", c.renew_interval,
               "lease renewal interval (at most a third of the leader's own lease)"),
      duration("retry-interval", c.retry_interval, "how often a follower tries to take the lock"),
      duration("shutdown-grace", c.shutdown_grace, "how long SIGTERM waits for running jobs"),
      duration("retry-base", c.retry_base, "first retry delay of a failed job"),
      duration("retry-cap", c.retry_cap, "longest retry delay"),
      duration("history-retention", c.history_retention, "how long job_history keeps rows"),
      text("log-level", log_level, "trace, debug, info, warn or error"),
      text("log-format", log_format, "text or json (one object per line)"),
  };
}

Settings::Impl::Schedule Settings::Impl::parse_schedule(const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("schedule: '" + s + "' is not NAME[:TYPE]=SPEC (e.g. cleanup=every 5m)");
  }
  Schedule out;
  out.name = s.substr(0, eq);
  out.spec = s.substr(eq + 1);
  if (const auto colon = out.name.find(':'); colon != std::string::npos) {
    out.options.type = out.name.substr(colon + 1);
    out.name = out.name.substr(0, colon);
  }
  if (out.spec.rfind("every ", 0) == 0) {
    out.every = true;
    out.spec = out.spec.substr(6);
    detail::every(parse_duration(out.spec, "schedule " + out.name));  // checks it
  } else {
    if (const auto at = out.spec.find(" tz="); at != std::string::npos) {
      out.tz = out.spec.substr(at + 4);
      out.spec = out.spec.substr(0, at);
    }
    detail::cron(out.spec, out.tz);  // checks it
  }
  return out;
}

Settings::Settings(std::string description) : impl_(std::make_unique<Impl>()) {
  impl_->description = std::move(description);
  impl_->build_table();
}

Settings::~Settings() = default;

void Settings::add(const std::string& name, const std::string& help, std::string* value) {
  impl_->extra.push_back({name, help, [value](const std::string& v) { *value = v; },
                          [value] { return toml_string(*value); }});
}

const NodeConfig& Settings::node() const {
  return impl_->node;
}

std::optional<int> Settings::parse(int argc, char** argv) {
  auto& s = *impl_;
  std::vector<Setting*> all;
  for (auto& t : s.table)
    all.push_back(&t);
  for (auto& t : s.extra)
    all.push_back(&t);

  CLI::App app{s.description +
               "\nSettings: flag > BATON_<NAME> environment > --config TOML file > default."};
  std::map<std::string, std::string> flags;
  std::string config_file;
  bool print_config = false, no_migrate = false;
  app.add_option("--config", config_file, "TOML file of settings (keys are the flag names)");
  app.add_flag("--print-config", print_config,
               "print the effective settings (password hidden) and exit");
  app.add_flag("--no-migrate", no_migrate, "same as --migrate false");
  app.add_option("--schedule", s.schedules,
                 "a periodic job, repeatable: NAME[:TYPE]=every 5m, or NAME[:TYPE]=<5-field cron> "
                 "[tz=Europe/Paris]; the job type defaults to NAME")
      ->take_all();
  for (auto* setting : all) {
    const auto help =
        setting->help + " [" + env_name(setting->name) + "; default " + setting->show() + "]";
    if (setting->flag) {
      app.add_flag("--" + setting->name, flags[setting->name], help);
    } else {
      app.add_option("--" + setting->name, flags[setting->name], help);
    }
  }
  const std::string program =
      argc > 0 ? std::string(argv[0]).substr(std::string(argv[0]).rfind('/') + 1) : "baton";
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << program << ": " << e.what() << " (" << program << " --help)\n";
    return 2;
  }

  try {
    toml::table file;
    if (!config_file.empty()) {
      if (!std::ifstream(config_file)) {
        throw ConfigError("config: cannot read " + config_file +
                          " (missing, or not readable by this user)");
      }
      try {
        file = toml::parse_file(config_file);
      } catch (const toml::parse_error& e) {
        std::ostringstream where;
        where << e.source().begin;
        throw ConfigError("config: " + config_file + " is not valid TOML (" +
                          std::string(e.description()) + " at " + where.str() + ")");
      }
      for (const auto& [key, value] : file) {
        bool known = false;
        for (const auto* setting : all)
          known = known || setting->name == key.str();
        if (!known) {
          throw ConfigError("config: " + config_file + " has an unknown setting '" +
                            std::string(key.str()) + "'; the keys are the flag names of --help");
        }
      }
    }
    if (no_migrate) flags["migrate"] = "false";
    for (auto* setting : all) {
      std::string value, source;
      // NOLINTNEXTLINE(concurrency-mt-unsafe): settings are read before any thread starts
      const char* env = std::getenv(env_name(setting->name).c_str());
      // NOLINTNEXTLINE(concurrency-mt-unsafe): as above
      const char* database_url = std::getenv("DATABASE_URL");
      if (!flags[setting->name].empty()) {
        value = flags[setting->name];
        source = "--" + setting->name;
      } else if (env != nullptr && *env != '\0') {
        value = env;
        source = env_name(setting->name);
      } else if (setting->name == "database-url" && database_url != nullptr &&
                 *database_url != '\0') {
        value = database_url;
        source = "DATABASE_URL";
      } else if (const auto* node = file.get(setting->name)) {
        source = config_file + ", key " + setting->name;
        value = toml_text(source, *node);
      } else {
        continue;
      }
      try {
        setting->apply(value);
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(e.what()) + " (from " + source + ")");
      }
    }
    if (s.log_format != "text" && s.log_format != "json") {
      throw ConfigError("log-format: '" + s.log_format + "' is not text or json");
    }
    // Checked on a copy: the node id stays empty (the running node fills it), so that a file
    // made from --print-config does not pin this process's id.
    NodeConfig checked = s.node;
    checked.validate();
    for (const auto& schedule : s.schedules)
      Impl::parse_schedule(schedule);
    check_log_level(s.log_level);
  } catch (const ConfigError& e) {
    std::cerr << program << ": bad setting: " << e.what() << "\n";
    return 2;
  }
  if (print_config) {
    for (const auto* setting : all) {
      std::cout << setting->name << " = " << setting->show();
      if (setting->name == "node-id" && s.node.node_id.empty()) {
        std::cout << "  # empty: each process names itself <host>:<pid>";
      }
      std::cout << "\n";
    }
    return 0;
  }
  return std::nullopt;
}

void Settings::apply(Node& node) const {
  for (const auto& text : impl_->schedules) {
    const auto s = Impl::parse_schedule(text);
    if (s.every) {
      node.every(s.spec, s.name, nlohmann::json::object(), s.options);
    } else {
      node.cron(s.spec, s.name, nlohmann::json::object(), s.tz, s.options);
    }
  }
  configure_logging(node.config().node_id,
                    impl_->log_format == "json" ? LogFormat::json : LogFormat::text,
                    impl_->log_level);
}

}  // namespace baton
