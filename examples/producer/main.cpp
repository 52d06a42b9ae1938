// producer: a separate process that hands work to the cluster, two ways:
//   1. a batch of N jobs in one statement (one wake-up for the leader),
//   2. an order row and its confirmation job in ONE transaction of the application's own: the
//      job exists only if the order commits.
//   DATABASE_URL=... producer [N]
#include <baton/baton.h>
#include <pqxx/pqxx>

#include "example_env.h"

int main(int argc, char** argv) {
  const auto env = examples::env("producer");
  if (!env) return 2;
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  if (n < 1) {
    std::cerr << "producer: N must be a positive number\n";
    return 2;
  }
  try {
    baton::Client client(env->database_url, env->schema);
    std::vector<nlohmann::json> payloads;
    for (int i = 0; i < n; ++i)
      payloads.push_back({{"report", i}});
    const auto ids = client.enqueue_many("noop", payloads, {.queue = "reports"});
    std::cout << "batch: " << ids.size() << " jobs, ids " << ids.front() << ".." << ids.back()
              << "\n";

    pqxx::connection app(env->database_url);  // the application's own connection
    pqxx::work tx(app);
    tx.exec(
        "CREATE TABLE IF NOT EXISTS public.demo_orders (id bigserial PRIMARY KEY, "
        "email text NOT NULL)");
    const auto order = tx.exec(
                             "INSERT INTO public.demo_orders (email) "
                             "VALUES ('ada@example.com') RETURNING id")[0][0]
                           .as<long long>();
    const auto job = baton::enqueue_in(
        tx,
        {{"send_email",
          {{"to", "ada@example.com"}, {"subject", "order " + std::to_string(order)}},
          {.queue = "mail", .idempotency_key = "order-" + std::to_string(order)}}},
        {.schema = env->schema});
    tx.commit();
    std::cout << "in one transaction: order " << order << " and job " << job.at(0) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "producer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
