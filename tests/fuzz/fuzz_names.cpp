// Fuzzes queue/type name and schema validation: accepted names never hold a character that
// would need quoting or escaping in SQL.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <baton/client.h>
#include <baton/config.h>

#include "baton/detail/db.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view name(reinterpret_cast<const char*>(data), size);
  try {
    baton::detail::validate_name("queue", name);
    for (char c : name) {
      if (c == '\'' || c == '"' || c == ';' || c == '\\' || c == ' ' || c == '\0') __builtin_trap();
    }
  } catch (const baton::EnqueueError&) {
  }
  try {
    baton::detail::validate_schema_name(name);
    for (char c : name) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) __builtin_trap();
    }
  } catch (const baton::ConfigError&) {
  }
  return 0;
}
