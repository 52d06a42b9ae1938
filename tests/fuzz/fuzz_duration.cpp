// Fuzzes duration parsing: any text either parses or throws ConfigError naming the setting.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <baton/config.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto d = baton::parse_duration(text, "fuzz");
    if (d.count() < 0) __builtin_trap();  // durations are never negative
  } catch (const baton::ConfigError&) {
  }
  return 0;
}
