// batonctl's output (see output.h).
#include "output.h"

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "baton/detail/inspect.h"

namespace batonctl {
namespace {

std::string dump(const nlohmann::ordered_json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string cell_text(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return dump(v);
}

}  // namespace

void print_rows(const nlohmann::ordered_json& rows, bool json) {
  if (json) {
    std::cout << dump(rows, 2) << "\n";
    return;
  }
  if (rows.empty()) {
    std::printf("(none)\n");
    return;
  }
  std::vector<std::string> names;
  for (const auto& [key, value] : rows.front().items())
    names.push_back(key);
  std::vector<std::size_t> width(names.size());
  for (std::size_t i = 0; i < names.size(); ++i)
    width[i] = names[i].size();
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < names.size(); ++i)
      width[i] = std::max(width[i], cell_text(row[names[i]]).size());
  }
  auto line = [&](auto text_of) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::string text = text_of(i);
      std::printf("%-*s%s", static_cast<int>(width[i]), text.c_str(),
                  i + 1 < names.size() ? "  " : "\n");
    }
  };
  line([&](std::size_t i) { return names[i]; });
  for (const auto& row : rows)
    line([&](std::size_t i) { return cell_text(row[names[i]]); });
}

void print_rows(const pqxx::result& rows, bool json) {
  if (!json && rows.empty()) {
    // Still show the columns' names: an empty table says what it would list.
    std::printf("(none)\n");
    return;
  }
  print_rows(baton::detail::inspect::to_json(rows), json);
}

void print_record(const pqxx::result& rows, bool json) {
  const auto records = baton::detail::inspect::to_json(rows);
  if (json) {
    print_rows(records, true);
    return;
  }
  for (const auto& [key, value] : records.front().items()) {
    const std::string text =
        value.is_object() || value.is_array() ? dump(value, 2) : cell_text(value);
    std::printf("%-19s %s\n", key.c_str(), text.c_str());
  }
}

void print_result(bool json, const std::string& text, const nlohmann::ordered_json& object) {
  if (json) {
    std::cout << dump(object) << "\n";
  } else {
    std::cout << text << "\n";
  }
}

}  // namespace batonctl
