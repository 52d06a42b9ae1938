// The SQL migrations embedded at build time from sql/*.sql.
#pragma once

#include <string_view>
#include <vector>

namespace baton::detail {

struct Migration {
  int version;
  std::string_view name;
  std::string_view sql;
};

const std::vector<Migration>& embedded_migrations();

}  // namespace baton::detail
