// batond: a baton node with the built-in handlers (noop, sleep, fail, record_tx) and the
// examples' handlers (send_email). Users normally build their own node; this one serves demos,
// drills and benchmarks.
//
// Every setting comes from, in this order of precedence: a flag (--threads 4), the environment
// (BATON_THREADS=4; DATABASE_URL too for the database), a TOML file (--config batond.toml with
// `threads = 4`), the default. Each source goes through the same parser, so a bad value gets the
// same message wherever it came from, naming the setting and the source.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include <baton/baton.h>
#include <baton/detail/db.h>

#include "builtin/builtin.h"
#include "email_sender/email.h"
#include "order_saga/order.h"

namespace {

using baton::ConfigError;

struct Setting {
  std::string name;  // flag --name, TOML key `name`, environment BATON_NAME (- becomes _)
  std::string help;
  std::function<void(const std::string&)> apply;  // parses and stores; throws ConfigError
  std::function<std::string()> show;              // the effective value, as TOML
};

std::string env_name(const std::string& name) {
  std::string e = "BATON_";
  for (char c : name)
    e += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return e;
}

int parse_int(const std::string& name, const std::string& text) {
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw ConfigError(name + ": '" + text + "' is not a whole number");
  }
  return value;
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

std::string ms_text(baton::Millis d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return "\"" + std::to_string(ms / 3'600'000) + "h\"";
  if (ms != 0 && ms % 60'000 == 0) return "\"" + std::to_string(ms / 60'000) + "m\"";
  if (ms != 0 && ms % 1000 == 0) return "\"" + std::to_string(ms / 1000) + "s\"";
  return "\"" + std::to_string(ms) + "ms\"";
}

// A TOML value as the text a flag would carry.
std::string toml_text(const std::string& key, const toml::node& node) {
  if (auto s = node.value<std::string>()) return *s;
  if (auto i = node.value<std::int64_t>()) return std::to_string(*i);
  if (auto b = node.value<bool>()) return *b ? "true" : "false";
  std::string out;
  if (const auto* arr = node.as_array()) {
    for (const auto& item : *arr) {
      out += (out.empty() ? "" : ",") + toml_text(key, item);
    }
    return out;
  }
  if (const auto* table = node.as_table()) {
    for (const auto& [k, v] : *table) {
      out += (out.empty() ? "" : ",") + std::string(k.str()) + "=" + toml_text(key, v);
    }
    return out;
  }
  throw ConfigError(key + ": unsupported TOML value type");
}

}  // namespace

int main(int argc, char** argv) {
  baton::NodeConfig c;
  std::string outbox, log_level = "info", log_format = "text";

  auto duration = [](const std::string& name, baton::Millis& field) {
    return Setting{name, "",
                   [&field, name](const std::string& v) { field = baton::parse_duration(v, name); },
                   [&field] { return ms_text(field); }};
  };
  auto text = [](const std::string& name, std::string& field) {
    return Setting{name, "", [&field](const std::string& v) { field = v; },
                   [&field] { return "\"" + field + "\""; }};
  };
  auto number = [](const std::string& name, int& field) {
    return Setting{name, "", [&field, name](const std::string& v) { field = parse_int(name, v); },
                   [&field] { return std::to_string(field); }};
  };
  std::vector<std::pair<Setting, std::string>> table{
      {{"database-url", "", [&](const std::string& v) { c.database_url = v; },
        [&] { return "\"" + baton::redact_database_url(c.database_url) + "\""; }},
       "libpq connection string, URI or key=value (also $DATABASE_URL)"},
      {text("schema", c.schema), "schema holding baton's tables"},
      {text("node-id", c.node_id), "this node's name (default host:pid)"},
      {number("threads", c.threads), "handler threads"},
      {{"queues", "", [&](const std::string& v) { c.queues = split(v); },
        [&] {
          std::string out;
          for (const auto& q : c.queues)
            out += (out.empty() ? "\"" : ",\"") + q + "\"";
          return "[" + out + "]";
        }},
       "comma-separated queues to consume (default: all)"},
      {{"queue-concurrency", "",
        [&](const std::string& v) {
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
        [&] {
          std::string out;
          for (const auto& [q, n] : c.queue_concurrency) {
            out += (out.empty() ? "" : ", ") + q + " = " + std::to_string(n);
          }
          return "{ " + out + " }";
        }},
       "per-queue limits of jobs running at once: queue=N,queue=N"},
      {text("metrics-listen", c.metrics_listen), "host:port for /metrics (port 0: any), or off"},
      {{"migrate", "", [&](const std::string& v) { c.migrate = parse_bool("migrate", v); },
        [&] { return std::string(c.migrate ? "true" : "false"); }},
       "apply pending migrations at start (true/false)"},
      {number("batch-size", c.batch_size),
       "most jobs one claim takes, and most claimed jobs waiting for a thread"},
      {duration("poll-interval", c.poll_interval), "poll when no NOTIFY arrives"},
      {text("lock-key", c.lock_key), "lock row key"},
      {text("region", c.region), "lock row region"},
      {duration("lock-ttl", c.lock_ttl), "leadership lease length"},
      {duration("renew-interval", c.renew_interval), "lease renewal interval (<= lock-ttl / 3)"},
      {duration("retry-interval", c.retry_interval), "how often a follower tries to lead"},
      {duration("shutdown-grace", c.shutdown_grace), "how long SIGTERM waits for running jobs"},
      {duration("retry-base", c.retry_base), "first retry delay of a failed job"},
      {duration("retry-cap", c.retry_cap), "longest retry delay"},
      {duration("history-retention", c.history_retention), "how long job_history keeps rows"},
      {text("outbox", outbox), "directory where send_email writes messages (default: log)"},
      {text("log-level", log_level), "trace, debug, info, warn or error"},
      {text("log-format", log_format), "text or json (one object per line)"},
  };

  CLI::App app{
      "batond: a node of a baton cluster. Every node runs the same binary; one leads.\n"
      "Settings: flag > BATON_<NAME> environment > --config TOML file > default."};
  std::map<std::string, std::string> flags;
  std::string config_file;
  bool print_config = false, no_migrate = false;
  app.add_option("--config", config_file, "TOML file of settings (keys are the flag names)");
  app.add_flag("--print-config", print_config,
               "print the effective settings (password hidden) and exit");
  app.add_flag("--no-migrate", no_migrate, "same as --migrate false");
  std::vector<std::string> schedules;
  app.add_option("--schedule", schedules,
                 "a periodic job, repeatable: NAME[:TYPE]=every 5m, or NAME[:TYPE]=<5-field cron> "
                 "[tz=Europe/Paris]; the job type defaults to NAME")
      ->take_all();
  for (auto& [s, help] : table) {
    const std::string shown = s.show();
    app.add_option("--" + s.name, flags[s.name],
                   help + " [" + env_name(s.name) + "; default " + shown + "]");
  }
  CLI11_PARSE(app, argc, argv);

  try {
    toml::table file;
    if (!config_file.empty()) {
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
        for (const auto& entry : table)
          known = known || entry.first.name == key.str();
        if (!known) {
          throw ConfigError("config: " + config_file + " has an unknown setting '" +
                            std::string(key.str()) + "'; the keys are the flag names of --help");
        }
      }
    }
    if (no_migrate) flags["migrate"] = "false";
    for (auto& [s, help] : table) {
      std::string value, source;
      // NOLINTNEXTLINE(concurrency-mt-unsafe): settings are read before any thread starts
      const char* env = std::getenv(env_name(s.name).c_str());
      if (!flags[s.name].empty()) {
        value = flags[s.name];
        source = "--" + s.name;
      } else if (env != nullptr && *env != '\0') {
        value = env;
        source = env_name(s.name);
      } else if (s.name == "database-url" &&
                 std::getenv("DATABASE_URL") != nullptr) {  // NOLINT(concurrency-mt-unsafe)
        value = std::getenv("DATABASE_URL");                // NOLINT(concurrency-mt-unsafe)
        source = "DATABASE_URL";
      } else if (const auto* node = file.get(s.name)) {
        value = toml_text(s.name, *node);
        source = config_file;
      } else {
        continue;
      }
      try {
        s.apply(value);
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(e.what()) + " (from " + source + ")");
      }
    }
    if (log_format != "text" && log_format != "json") {
      throw ConfigError("log-format: '" + log_format + "' is not text or json");
    }
    baton::Node node(c);  // validates; fills node_id
    c = node.config();
    for (const auto& s : schedules) {
      const auto eq = s.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw ConfigError("schedule: '" + s + "' is not NAME[:TYPE]=SPEC (e.g. cleanup=every 5m)");
      }
      std::string name = s.substr(0, eq), spec = s.substr(eq + 1);
      baton::ScheduleOptions options;
      if (const auto colon = name.find(':'); colon != std::string::npos) {
        options.type = name.substr(colon + 1);
        name = name.substr(0, colon);
      }
      if (spec.rfind("every ", 0) == 0) {
        node.every(std::string_view(spec).substr(6), name, nlohmann::json::object(), options);
      } else {
        std::string tz = "UTC";
        if (const auto at = spec.find(" tz="); at != std::string::npos) {
          tz = spec.substr(at + 4);
          spec = spec.substr(0, at);
        }
        node.cron(spec, name, nlohmann::json::object(), tz, options);
      }
    }
    if (print_config) {
      for (auto& [s, help] : table)
        std::cout << s.name << " = " << s.show() << "\n";
      return 0;
    }
    baton::configure_logging(node.config().node_id,
                             log_format == "json" ? baton::LogFormat::json : baton::LogFormat::text,
                             log_level);
    builtin::register_handlers(node);
    email::register_handlers(node, outbox);
    order::register_handlers(node);
    node.run();
  } catch (const ConfigError& e) {
    std::cerr << "batond: bad setting: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "batond: " << baton::detail::scrub(e.what()) << "\n";
    return 1;
  }
  return 0;
}
