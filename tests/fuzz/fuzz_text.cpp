// Fuzzes the cleaning of handlers' text before it is stored: whatever the bytes, clean_text keeps
// only text that a second, independent UTF-8 decoder (code point ranges, not byte tables) calls
// well-formed, as PostgreSQL would; valid text is kept as it is; one_line has no control
// characters; base64_decode inverts an encoding. The integration test HostileStrings checks the
// same against PostgreSQL itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "baton/detail/text.h"

namespace {

// Decodes by accumulating code points, then checks the range and the shortest form.
bool reference_valid(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    int extra = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (extra > 0 && i + static_cast<std::size_t>(extra) >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    static const std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<std::size_t>(extra) + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t max = size % 64 + 1;
  const auto cleaned = baton::detail::clean_text(text, max);
  if (cleaned.size() > max) __builtin_trap();
  if (!reference_valid(cleaned)) __builtin_trap();
  if (baton::detail::valid_utf8(text) != reference_valid(text)) __builtin_trap();
  if (reference_valid(text) && baton::detail::clean_text(text, size) != text) __builtin_trap();
  if (baton::detail::clean_text(cleaned, max) != cleaned) __builtin_trap();
  for (char c : baton::detail::one_line(text)) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) __builtin_trap();
  }
  // base64 (the console's basic auth): any bytes decode to at most 3/4 of their length, and
  // bytes encoded here decode back to themselves.
  if (baton::detail::base64_decode(text).size() > size * 3 / 4 + 1) __builtin_trap();
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string encoded;
  for (std::size_t i = 0; i < size; i += 3) {
    const std::uint32_t n = (std::uint32_t{data[i]} << 16U) |
                            (i + 1 < size ? std::uint32_t{data[i + 1]} << 8U : 0U) |
                            (i + 2 < size ? std::uint32_t{data[i + 2]} : 0U);
    encoded += kAlphabet[(n >> 18U) & 63U];
    encoded += kAlphabet[(n >> 12U) & 63U];
    encoded += i + 1 < size ? kAlphabet[(n >> 6U) & 63U] : '=';
    encoded += i + 2 < size ? kAlphabet[n & 63U] : '=';
  }
  if (baton::detail::base64_decode(encoded) != text) __builtin_trap();
  return 0;
}
