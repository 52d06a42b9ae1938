// The database a benchmark runs against: DATABASE_URL when set, else a throwaway PostgreSQL
// started with scripts/pg in a temporary directory and destroyed at the end.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "support/testkit.h"

namespace baton::bench {

// A bench's flags come in pairs, --name value. Returns the exit code when the program should end
// here: 0 after --help (the usage on stdout), 2 when a flag has no value (what was wrong and the
// usage on stderr); -1 to go on.
inline int check_flag_pairs(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: %s\n", usage);
      return 0;
    }
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s: %s needs a value\nusage: %s\n", argv[0], argv[i], usage);
      return 2;
    }
  }
  return -1;
}

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
