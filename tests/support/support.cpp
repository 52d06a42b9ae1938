// Test support (see support.h).
#include "support/support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

extern char** environ;

namespace baton::test {

std::string database_url() {
  const char* url = std::getenv("DATABASE_URL");
  if (url == nullptr || *url == '\0') {
    ADD_FAILURE() << "DATABASE_URL is not set: run the tests with scripts/test, which starts a "
                     "throwaway PostgreSQL, or start one with scripts/pg start DIR and point "
                     "DATABASE_URL at it (the tests leave their schemas and roles behind)";
    return "postgresql://invalid-host-set-DATABASE_URL/";
  }
  return url;
}

std::string unique_schema(const std::string& what) {
  static std::atomic<int> counter{0};
  std::string clean;
  for (char c : what)
    clean += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? static_cast<char>(std::tolower(c))
                                                                : '_';
  // The pid alone repeats over many runs against one server, where a failed run may have left
  // its schema behind: a random suffix keeps names apart.
  static const unsigned salt = std::random_device{}() % 1'000'000;
  return "t_" + clean.substr(0, 30) + "_" + std::to_string(getpid()) + "_" + std::to_string(salt) +
         "_" + std::to_string(counter.fetch_add(1));
}

std::unique_ptr<pqxx::connection> connect(const std::string& schema, const std::string& url) {
  auto conn = std::make_unique<pqxx::connection>(url.empty() ? database_url() : url);
  pqxx::nontransaction tx(*conn);
  tx.exec("SET search_path TO " + tx.quote_name(schema));
  return conn;
}

std::string query_value(pqxx::connection& conn, const std::string& sql) {
  pqxx::nontransaction tx(conn);
  auto r = tx.exec(sql);
  if (r.empty() || r[0][0].is_null()) return "";
  return r[0][0].c_str();
}

long long query_int(pqxx::connection& conn, const std::string& sql) {
  auto v = query_value(conn, sql);
  return v.empty() ? 0 : std::stoll(v);
}

}  // namespace baton::test
