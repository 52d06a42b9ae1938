// What the example programs read from the environment: DATABASE_URL (required) and
// BATON_SCHEMA (default "baton").
#pragma once

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

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

}  // namespace examples
