// Logging for nodes: spdlog to stderr, as human text or as one JSON object per line.
// In JSON, every `key=value` word of a message (job=42 queue=mail epoch=3 ...) becomes a field of
// its own beside ts, level, node and msg, so log pipelines can filter on job, queue and type.
#pragma once

#include <string>
#include <string_view>

namespace baton {

enum class LogFormat { text, json };

// Replaces the default logger. `level` is trace, debug, info, warn or error.
// Throws ConfigError for an unknown level.
void configure_logging(const std::string& node_id, LogFormat format, std::string_view level);

// Throws ConfigError unless `level` is one configure_logging takes.
void check_log_level(std::string_view level);

}  // namespace baton
