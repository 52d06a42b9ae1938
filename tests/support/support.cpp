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
#include <mutex>
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
                     "DATABASE_URL at it (the tests drop their schemas and roles when every test "
                     "of a program passed)";
    return "postgresql://invalid-host-set-DATABASE_URL/";
  }
  return url;
}

namespace {

struct TrackedSchemas {
  std::mutex mutex;
  std::vector<std::pair<std::string, bool>> names;  // and whether its roles go with it
};

TrackedSchemas& tracked_schemas() {
  static TrackedSchemas tracked;
  return tracked;
}

// The tests name a schema's roles after its first 40 characters (role_name keeps 50, the tests'
// own helpers 40) and "_": a schema's whole name fits in them, so that its roles are told from
// every other run's, and "t_" + 19 + "_<pid>_<salt>_<n>" does with a 7-digit pid.
constexpr std::size_t kRoleStem = 40;
constexpr std::size_t kWhatLength = 19;

void track(const std::string& schema, bool with_roles) {
  auto& tracked = tracked_schemas();
  const std::lock_guard lock(tracked.mutex);
  tracked.names.emplace_back(schema, with_roles);
}

}  // namespace

std::string unique_schema(const std::string& what) {
  static std::atomic<int> counter{0};
  std::string clean;
  for (char c : what)
    clean += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? static_cast<char>(std::tolower(c))
                                                                : '_';
  // The pid alone repeats over many runs against one server, where a failed run may have left
  // its schema behind: a random suffix keeps names apart.
  static const unsigned salt = std::random_device{}() % 1'000'000;
  auto name = "t_" + clean.substr(0, kWhatLength) + "_" + std::to_string(getpid()) + "_" +
              std::to_string(salt) + "_" + std::to_string(counter.fetch_add(1));
  track(name, true);
  return name;
}

void track_schema(const std::string& schema) {
  track(schema, false);
}

void end_tracked_schemas(bool drop) {
  auto& tracked = tracked_schemas();
  const std::lock_guard lock(tracked.mutex);
  if (tracked.names.empty()) return;
  const char* url = std::getenv("DATABASE_URL");
  if (!drop || url == nullptr || *url == '\0') {
    for (const auto& [name, roles] : tracked.names)
      std::fprintf(stderr, "schema kept in the test database: %s\n", name.c_str());
    tracked.names.clear();
    return;
  }
  // Each drop on its own: one that fails (a role still connected, a server gone) is named and
  // leaves the others to go.
  try {
    setenv("PGCONNECT_TIMEOUT", "10", 0);  // a server gone: give up, do not hang the program's end
    pqxx::connection conn(url);
    pqxx::nontransaction tx(conn);
    // A killed node's server session may hold a lock a moment longer: wait for it, boundedly.
    tx.exec("SET lock_timeout = '10s'");
    tx.exec("SET client_min_messages = warning");  // no list of what each CASCADE dropped
    for (const auto& [name, with_roles] : tracked.names) {
      try {
        tx.exec("DROP SCHEMA IF EXISTS " + tx.quote_name(name) + " CASCADE");
        if (!with_roles) continue;
        if (name.size() > kRoleStem) {
          std::fprintf(stderr, "roles of test schema %s kept: its name is too long to tell them\n",
                       name.c_str());
          continue;
        }
        const auto roles = tx.exec_params(
            "SELECT rolname FROM pg_catalog.pg_roles WHERE starts_with(rolname, $1) ORDER BY 1",
            name + "_");
        for (const auto& row : roles) {
          const auto role = tx.quote_name(row[0].c_str());
          tx.exec("DROP OWNED BY " + role + " CASCADE");
          tx.exec("DROP ROLE " + role);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "could not drop test schema %s or its roles: %s\n", name.c_str(),
                     e.what());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "could not drop the test schemas: %s\n", e.what());
  }
  tracked.names.clear();
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
