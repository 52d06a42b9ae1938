// Text that goes into the database from handlers (error messages) must be valid UTF-8 without NUL
// bytes, or the statement carrying it fails and the outcome could never be recorded.
#pragma once

#include <string>
#include <string_view>

namespace baton::detail {

// Replaces NUL bytes and invalid UTF-8 with '?', and cuts to at most `max_bytes` bytes.
std::string clean_text(std::string_view text, std::size_t max_bytes);

}  // namespace baton::detail
