// TLS to PostgreSQL: a server with ssl = on and a CA made here; a node connects with
// sslmode=verify-full and leads; with another CA it is refused clearly and keeps retrying.
#include <gtest/gtest.h>

#include <unistd.h>

#include "support/cluster.h"

namespace {

using namespace baton::test;

TEST(Tls, VerifyFullWorksWithTheRightCaAndIsRefusedWithAnother) {
  const std::string dir = temp_dir("tls");
  ThrowawayServer server(dir);
  const std::string url = server.url();
  std::string out;
  const std::string certs =
      "cd " + dir +
      " && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 "
      "-subj /CN=baton-test-ca && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other-ca.crt -days 2 "
      "-subj /CN=someone-else && "
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost "
      "&& "
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > ext.cnf && "
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
      "-days 2 -extfile ext.cnf && "
      "cp server.crt server.key pg/data/ && chmod 600 pg/data/server.key" +
      std::string(getuid() == 0 ? " && chown postgres: pg/data/server.crt pg/data/server.key" : "");
  ASSERT_EQ(run_command(certs, &out), 0) << out;
  ASSERT_EQ(run_command("psql '" + url +
                            "' -XAtq -c 'ALTER SYSTEM SET ssl = on' -c "
                            "'SELECT pg_reload_conf()'",
                        &out),
            0)
      << out;
  const std::string tls = "host=localhost port=" + server.port() +
                          " user=postgres dbname=postgres sslmode=verify-full sslrootcert=" + dir;
  ASSERT_TRUE(wait_for(
      [&] { return run_command("psql '" + tls + "/ca.crt' -XAtq -c 'SELECT 1'", &out) == 0; }, 20s))
      << out;

  Process good({binary("batond"), "--database-url", tls + "/ca.crt", "--schema", "tls_ok",
                "--metrics-listen", "off", "--node-id", "secure"},
               dir + "/good.log");
  ASSERT_TRUE(wait_for(
      [&] {
        return run_command("psql '" + tls +
                               "/ca.crt' -XAtq -c \"SELECT client_id FROM "
                               "tls_ok.locks\"",
                           &out) == 0 &&
               out.find("secure") != std::string::npos;
      },
      30s))
      << good.log();
  ASSERT_EQ(run_command("psql '" + tls +
                            "/ca.crt' -XAtq -c \"SELECT count(*) FROM "
                            "pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND "
                            "a.application_name = 'secure@tls_ok'\"",
                        &out),
            0);
  EXPECT_GE(std::stoi(out), 1) << "the node's sessions use TLS";

  Process wrong({binary("batond"), "--database-url", tls + "/other-ca.crt", "--schema", "tls_ok",
                 "--metrics-listen", "off", "--node-id", "mistrusting"},
                dir + "/wrong.log");
  ASSERT_TRUE(wait_for(
      [&] { return wrong.log().find("certificate verify failed") != std::string::npos; }, 20s))
      << wrong.log();
  EXPECT_NE(wrong.log().find("database unreachable"), std::string::npos) << wrong.log();
  EXPECT_TRUE(wrong.running()) << "it keeps retrying";
}

}  // namespace
