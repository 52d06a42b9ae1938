// UTF-8 checking and cleaning for text stored in the database (see text.h).
#include "baton/detail/text.h"

namespace baton::detail {
namespace {

bool continuation(unsigned char c) {
  return (c & 0xc0) == 0x80;
}

}  // namespace

std::size_t utf8_char_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char c = b(0);
  if (c == 0) return 0;
  if (c < 0x80) return 1;
  // The second byte's range depends on the first (Unicode's table of well-formed sequences):
  // it is what excludes overlong forms, surrogates and code points above U+10FFFF.
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // U+0800 and up: shorter would be overlong
    if (c == 0xed) hi = 0x9f;  // below U+D800: the surrogates are not characters
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;  // U+10000 and up
    if (c == 0xf4) hi = 0x8f;  // up to U+10FFFF
  } else {
    return 0;  // 0x80..0xc1 (a continuation, or an overlong lead) and 0xf5..0xff
  }
  if (text.size() < len || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t i = 2; i < len; ++i) {
    if (!continuation(b(i))) return 0;
  }
  return len;
}

bool valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto n = utf8_char_length(text.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string clean_text(std::string_view text, std::size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (std::size_t i = 0; i < text.size();) {
    const auto n = utf8_char_length(text.substr(i));
    if (out.size() + (n == 0 ? 1 : n) > max_bytes) break;
    if (n == 0) {
      out += '?';
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace baton::detail

namespace baton::detail {

std::string base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (const char c : text) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) return "";
    acc = (acc << 6U) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> static_cast<unsigned>(bits)) & 0xffU);
    }
  }
  return out;
}

std::string one_line(std::string_view text, std::size_t max_bytes) {
  std::string out = clean_text(text, max_bytes);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  while (!out.empty() && out.back() == ' ')
    out.pop_back();
  return out;
}

}  // namespace baton::detail
