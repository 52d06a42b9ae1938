// sms_partitioned: SMS messages partitioned by destination. The queue "sms" is ordered with 16
// partitions, so the messages to one number go out one at a time, in the order they were
// enqueued, while different numbers are served in parallel on the pool's threads.
// The "carrier" here is a table, sms_log, written in the job's own transaction (exactly once).
//   DATABASE_URL=... sms_partitioned
//   echo '{"type":"send_sms","queue":"sms","partition_key":"+100",
//          "payload":{"to":"+100","text":"hi"}}' | batonctl enqueue --file -
#include <baton/baton.h>
#include <pqxx/pqxx>

#include "example_env.h"

int main() {
  const auto env = examples::env("sms_partitioned");
  if (!env) return 2;
  try {
    auto config = examples::node_config(*env);
    config.threads = 8;
    baton::Node node(config);
    {
      // The example's own table, and the queue declared ordered (idempotent).
      pqxx::connection conn(env->database_url);
      pqxx::work tx(conn);
      tx.exec("CREATE TABLE IF NOT EXISTS " + tx.quote_name(env->schema) +
              ".sms_log (id bigserial PRIMARY KEY, destination text NOT NULL, text text NOT NULL, "
              "job_id bigint NOT NULL, sent_at timestamptz NOT NULL DEFAULT clock_timestamp())");
      tx.commit();
      baton::Client(env->database_url, env->schema).declare_ordered_queue("sms", 16);
    }
    node.handle_tx("send_sms", [](baton::JobContext& ctx, pqxx::work& tx) {
      const auto p = ctx.payload();
      if (!p.contains("to") || !p.contains("text")) throw baton::Discard("needs to and text");
      tx.exec_params("INSERT INTO sms_log (destination, text, job_id) VALUES ($1, $2, $3)",
                     p["to"].get<std::string>(), p["text"].get<std::string>(), ctx.job().id);
    });
    node.run();
  } catch (const std::exception& e) {
    std::cerr << "sms_partitioned: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
