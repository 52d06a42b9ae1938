// How batonctl prints: aligned columns for people, JSON for scripts (--json).
#pragma once

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

namespace batonctl {

// Rows as aligned columns ("(none)" when empty), or as a JSON array of objects.
void print_rows(const pqxx::result& rows, bool json);
void print_rows(const nlohmann::ordered_json& rows, bool json);
// One row, one field a line with JSON values pretty-printed (JSON: an array of one object).
void print_record(const pqxx::result& rows, bool json);
// A result line: `text` for people, `object` with --json.
void print_result(bool json, const std::string& text, const nlohmann::ordered_json& object);

}  // namespace batonctl
