// Roles for tests (see roles.h).
#include "support/roles.h"

#include <fstream>
#include <regex>
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
  sql = std::regex_replace(sql, std::regex("\\b" + placeholder + "\\b"), role);
  sql = std::regex_replace(sql, std::regex(R"(\bbaton\.)"), schema + ".");
  sql = std::regex_replace(sql, std::regex(R"(SCHEMA baton\b)"), "SCHEMA " + schema);
  return sql;
}

}  // namespace baton::test
