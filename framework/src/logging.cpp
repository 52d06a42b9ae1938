// Node logging: text or JSON lines on stderr (see baton/logging.h).
#include "baton/logging.h"

#include <cstdio>
#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "baton/config.h"

namespace baton {
namespace {

// Lifts key=value words out of a message. Values that are whole numbers become numbers.
void lift_fields(std::string_view msg, nlohmann::json& out) {
  std::size_t i = 0;
  while (i < msg.size()) {
    const auto end = msg.find(' ', i);
    std::string_view word = msg.substr(i, end == std::string_view::npos ? msg.size() - i : end - i);
    i = end == std::string_view::npos ? msg.size() : end + 1;
    while (!word.empty() && (word.back() == ':' || word.back() == ','))
      word.remove_suffix(1);
    const auto eq = word.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == word.size()) continue;
    const auto key = word.substr(0, eq);
    bool key_ok = true;
    for (char c : key)
      key_ok = key_ok && ((c >= 'a' && c <= 'z') || c == '_');
    if (!key_ok || key == "ts" || key == "level" || key == "msg" || key == "node") continue;
    const std::string value(word.substr(eq + 1));
    char* rest = nullptr;
    const long long number = std::strtoll(value.c_str(), &rest, 10);
    if (rest != nullptr && *rest == '\0') {
      out[std::string(key)] = number;
    } else {
      out[std::string(key)] = value;
    }
  }
}

class JsonSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit JsonSink(std::string node_id) : node_id_(std::move(node_id)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const auto t = std::chrono::system_clock::to_time_t(msg.time);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count() %
        1000;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char ts[64];
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(ms));
    const std::string_view text(msg.payload.data(), msg.payload.size());
    nlohmann::json line{{"ts", ts},
                        {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                                              spdlog::level::to_string_view(msg.level).size())},
                        {"node", node_id_},
                        {"msg", text}};
    lift_fields(text, line);
    const std::string out =
        line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(out.data(), 1, out.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  std::string node_id_;
};

}  // namespace

void check_log_level(std::string_view level) {
  if (spdlog::level::from_str(std::string(level)) == spdlog::level::off && level != "off") {
    throw ConfigError("log-level: '" + std::string(level) +
                      "' is not a level; use trace, debug, info, warn or error");
  }
}

void configure_logging(const std::string& node_id, LogFormat format, std::string_view level) {
  check_log_level(level);
  const auto lvl = spdlog::level::from_str(std::string(level));
  std::shared_ptr<spdlog::logger> logger;
  if (format == LogFormat::json) {
    logger = std::make_shared<spdlog::logger>("baton", std::make_shared<JsonSink>(node_id));
  } else {
    logger = spdlog::stderr_color_mt("baton-" + node_id);
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [" + node_id + "] %v");
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace baton
