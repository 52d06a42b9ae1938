// Fuzzes connection-string handling: describe and redact must never crash, and never return
// a password they were given.
#include <cstddef>
#include <cstdint>
#include <string>

#include <baton/config.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  // The secret may show only where the input itself put the same text.
  if (url.find("Fuzz-Secret-7") != std::string::npos) return 0;
  try {
    const auto shown = baton::describe_database_url(url + " password=Fuzz-Secret-7");
    if (shown.find("Fuzz-Secret-7") != std::string::npos) __builtin_trap();
  } catch (const baton::ConfigError&) {
  }
  const auto redacted = baton::redact_database_url("postgresql://u:Fuzz-Secret-7@" + url);
  if (redacted.find("Fuzz-Secret-7") != std::string::npos) __builtin_trap();
  baton::redact_database_url(url);
  return 0;
}
