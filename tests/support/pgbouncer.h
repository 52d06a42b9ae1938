// A PgBouncer of a test's own in front of the test database, on a free loopback port, in
// transaction or session pool mode. Debian's pgbouncer package (scripts/setup installs it).
// As root it runs as the postgres user (it refuses root).
#pragma once

#include <memory>
#include <string>

#include "support/testkit.h"

namespace baton::test {

class PgBouncer {
 public:
  // Pools connections to the server of `server_url` (libpq URL on 127.0.0.1, trust auth).
  PgBouncer(const std::string& server_url, const std::string& pool_mode, int pool_size);
  ~PgBouncer();
  PgBouncer(const PgBouncer&) = delete;
  PgBouncer& operator=(const PgBouncer&) = delete;

  // The pooled URL: same user and database as `server_url`.
  const std::string& url() const { return url_; }
  std::string log() const { return process_->log(); }

 private:
  std::string dir_;
  std::string url_;
  std::unique_ptr<Process> process_;
};

}  // namespace baton::test
