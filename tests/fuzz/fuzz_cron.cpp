// Fuzzes cron parsing: any expression parses or throws ConfigError; a parsed one's next tick is
// always later than the time asked about.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <baton/config.h>

#include "baton/detail/schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto s = baton::detail::cron(text, "UTC");
    const baton::detail::SysSeconds t(std::chrono::seconds(1'700'000'000));
    if (s->next_after(t) <= t) __builtin_trap();
  } catch (const baton::ConfigError&) {
  } catch (const std::runtime_error&) {
    // "never fires" (e.g. February 30th)
  }
  return 0;
}
