// What the example programs read from the environment: DATABASE_URL (required) and
// BATON_SCHEMA (default "baton").
#pragma once

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include <baton/baton.h>

namespace examples {

struct Env {
  std::string database_url;
  std::string schema;
};

inline std::optional<Env> env(const char* program) {
  const char* url = std::getenv("DATABASE_URL");
  if (url == nullptr || *url == '\0') {
    std::cerr << program << ": set DATABASE_URL (e.g. postgresql://user@127.0.0.1:5432/db)\n";
    return std::nullopt;
  }
  const char* schema = std::getenv("BATON_SCHEMA");
  return Env{url, schema != nullptr && *schema != '\0' ? schema : "baton"};
}

// A node config for the example: its database and schema, metrics on any free loopback port.
inline baton::NodeConfig node_config(const Env& env) {
  baton::NodeConfig config;
  config.database_url = env.database_url;
  config.schema = env.schema;
  config.metrics_listen = "127.0.0.1:0";
  return config;
}

}  // namespace examples
