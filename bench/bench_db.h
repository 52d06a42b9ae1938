// The database a benchmark runs against: DATABASE_URL when set, else a throwaway PostgreSQL
// started with scripts/pg in a temporary directory and destroyed at the end.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "support/testkit.h"

namespace baton::bench {

class BenchDatabase {
 public:
  BenchDatabase() {
    if (const char* url = std::getenv("DATABASE_URL"); url != nullptr && *url != '\0') {
      url_ = url;
      return;
    }
    dir_ = test::temp_dir("bench-pg");
    std::string out;
    if (test::run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg start " + dir_, &out) != 0) {
      throw std::runtime_error("could not start PostgreSQL: " + out);
    }
    url_ = out.substr(0, out.find('\n'));
  }
  ~BenchDatabase() {
    if (!dir_.empty())
      test::run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg destroy " + dir_, nullptr);
  }
  BenchDatabase(const BenchDatabase&) = delete;
  BenchDatabase& operator=(const BenchDatabase&) = delete;

  const std::string& url() const { return url_; }

 private:
  std::string url_;
  std::string dir_;
};

}  // namespace baton::bench
