// Text that goes into the database from handlers (error messages) must be valid UTF-8 without NUL
// bytes, or the statement carrying it fails and the outcome could never be recorded.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace baton::detail {

// The length of the well-formed UTF-8 character at the start of `text` (1..4), or 0 when it does
// not start with one. Well-formed is what PostgreSQL accepts in a UTF8 database: shortest form
// only, no UTF-16 surrogates (U+D800..U+DFFF), nothing above U+10FFFF, and no NUL.
std::size_t utf8_char_length(std::string_view text);

// True when every character of `text` is well-formed as above.
bool valid_utf8(std::string_view text);

// Replaces NUL bytes and every byte that does not start a well-formed character with '?', and
// cuts to at most `max_bytes` bytes, never inside a character.
std::string clean_text(std::string_view text, std::size_t max_bytes);

}  // namespace baton::detail

namespace baton::detail {

// The parts one after another, built in one allocation. Used where "literal" + std::string(...)
// would be: GCC 12 at -O3 reports a false -Wrestrict inside libstdc++ for that form.
template <class... Parts>
std::string concat(const Parts&... parts) {
  const std::string_view views[] = {std::string_view(parts)...};
  std::size_t size = 0;
  for (const auto v : views)
    size += v.size();
  std::string out;
  out.reserve(size);
  for (const auto v : views)
    out.append(v);
  return out;
}

// `text` as one clean log line: valid UTF-8 (as clean_text), line breaks and other control
// characters shown as spaces, trailing blanks removed. A handler's message cannot forge a log
// line, and a database error's trailing newline does not end up in the middle of a line.
std::string one_line(std::string_view text, std::size_t max_bytes = 2000);

// Standard base64 (RFC 4648, '=' padding optional) decoded; "" when `text` holds any other
// character.
std::string base64_decode(std::string_view text);

}  // namespace baton::detail
