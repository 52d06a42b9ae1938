// Roles for tests (see roles.h).
#include "support/roles.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "baton/config.h"
#include "support/support.h"

namespace baton::test {

std::string url_as(const std::string& role) {
  auto url = describe_database_url(database_url());
  return url.substr(0, url.find(" user=")) + " user=" + role;
}

std::string role_name(const std::string& schema, const std::string& what) {
  return schema.substr(0, 50) + "_" + what.substr(0, 12);
}

namespace {

bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// `text` with every occurrence of `from` that starts a word (and ends one, when `from` ends in a
// word character) replaced by `to`.
std::string replace_word(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t at = 0;
  for (auto hit = text.find(from); hit != std::string::npos; hit = text.find(from, hit + 1)) {
    if (hit < at) continue;
    const auto after = hit + from.size();
    const bool starts = hit == 0 || !word_char(text[hit - 1]);
    const bool ends = !word_char(from.back()) || after == text.size() || !word_char(text[after]);
    if (!starts || !ends) continue;
    out.append(text, at, hit - at).append(to);
    at = after;
  }
  return out.append(text, at, std::string::npos);
}

}  // namespace

std::string documented_block(const std::string& doc, const std::string& block,
                             const std::string& placeholder, const std::string& schema,
                             const std::string& role) {
  std::ifstream in(std::string(BATON_SOURCE_DIR) + "/docs/" + doc);
  std::stringstream text;
  text << in.rdbuf();
  const auto all = text.str();
  const auto begin = all.find("-- " + block + ":begin");
  const auto end = all.find("-- " + block + ":end");
  if (begin == std::string::npos || end == std::string::npos) {
    throw std::runtime_error("docs/" + doc + " has no block " + block);
  }
  auto sql = all.substr(begin, end - begin);
  sql = replace_word(sql, placeholder, role);
  sql = replace_word(sql, "baton.", schema + ".");
  sql = replace_word(sql, "SCHEMA baton", "SCHEMA " + schema);
  return sql;
}

}  // namespace baton::test
