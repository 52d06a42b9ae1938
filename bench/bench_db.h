// The database a benchmark runs against: DATABASE_URL when set, else a throwaway PostgreSQL
// started with scripts/pg in a temporary directory and destroyed at the end.
#pragma once

#include <cstdlib>
#include <memory>
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
    server_ = std::make_unique<test::ThrowawayServer>(test::temp_dir("bench-pg"));
    url_ = server_->url();
  }

  const std::string& url() const { return url_; }

 private:
  std::unique_ptr<test::ThrowawayServer> server_;
  std::string url_;
};

}  // namespace baton::bench
