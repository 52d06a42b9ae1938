// A test's own PgBouncer (see pgbouncer.h).
#include "support/pgbouncer.h"

#include <unistd.h>

#include <libpq-fe.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace baton::test {

namespace {

constexpr const char* kBinary = "/usr/sbin/pgbouncer";

// The value of `key` in a libpq URL or conninfo ("" when absent).
std::string url_part(const std::string& url, const char* key) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(url.c_str(), &err);
  if (opts == nullptr) {
    PQfreemem(err);
    throw std::invalid_argument("pgbouncer: cannot parse the database URL");
  }
  std::string value;
  for (auto* p = opts; p->keyword != nullptr; ++p) {
    if (std::strcmp(p->keyword, key) == 0 && p->val != nullptr) value = p->val;
  }
  PQconninfoFree(opts);
  return value;
}

}  // namespace

PgBouncer::PgBouncer(const std::string& server_url, const std::string& pool_mode, int pool_size)
    : dir_(temp_dir("pgbouncer")) {
  if (access(kBinary, X_OK) != 0) {
    throw std::runtime_error(std::string(kBinary) +
                             " is missing: run scripts/setup (Debian package pgbouncer)");
  }
  const auto user =
      url_part(server_url, "user").empty() ? std::string("postgres") : url_part(server_url, "user");
  const auto dbname =
      url_part(server_url, "dbname").empty() ? user : url_part(server_url, "dbname");
  const auto port = free_port();
  {
    std::ofstream users(dir_ + "/users.txt");
    users << '"' << user << "\" \"\"\n";
    std::ofstream ini(dir_ + "/pgbouncer.ini");
    ini << "[databases]\n* = host=127.0.0.1 port=" << url_part(server_url, "port") << "\n"
        << "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = " << port
        << "\nunix_socket_dir =\nauth_type = trust\nauth_file = " << dir_
        << "/users.txt\npool_mode = " << pool_mode << "\ndefault_pool_size = " << pool_size
        << "\nmax_client_conn = 500\n";
  }
  std::filesystem::permissions(
      dir_, std::filesystem::perms::others_read | std::filesystem::perms::others_exec,
      std::filesystem::perm_options::add);
  std::vector<std::string> argv{kBinary};
  if (geteuid() == 0) {
    argv.emplace_back("-u");
    argv.emplace_back("postgres");
  }
  argv.push_back(dir_ + "/pgbouncer.ini");
  process_ = std::make_unique<Process>(argv, dir_ + "/pgbouncer.log");
  url_ = "postgresql://" + user + "@127.0.0.1:" + std::to_string(port) + "/" + dbname;
  const bool up = wait_for(
      [&] {
        PGconn* c = PQconnectdb((url_ + "?connect_timeout=2").c_str());
        const bool ok = PQstatus(c) == CONNECTION_OK;
        PQfinish(c);
        return ok || !process_->running();
      },
      10s, 50ms);
  if (!up || !process_->running()) {
    throw std::runtime_error("pgbouncer did not start: " + process_->log());
  }
}

PgBouncer::~PgBouncer() {
  process_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace baton::test
