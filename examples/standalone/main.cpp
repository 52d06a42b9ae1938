// A program of its own built on baton: a node with one handler, a Client that enqueues a job,
// and the job handled. Exits 0 once the handler ran, 1 when it did not within 30 s.
//   DATABASE_URL=postgresql://... ./standalone [schema]
#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include <baton/baton.h>

struct Greet {
  static constexpr const char* type_name = "greet";
  std::string name;
};
void to_json(nlohmann::json& j, const Greet& g) {
  j = {{"name", g.name}};
}
void from_json(const nlohmann::json& j, Greet& g) {
  j.at("name").get_to(g.name);
}

int main(int argc, char** argv) {
  baton::NodeConfig config;  // the database from $DATABASE_URL
  config.schema = argc > 1 ? argv[1] : "standalone";
  config.metrics_listen = "off";
  config.handle_signals = false;
  std::atomic<bool> greeted{false};
  try {
    baton::Node node(config);
    node.handle<Greet>(Greet::type_name, [&](baton::JobContext& ctx, const Greet& g) {
      std::cout << "hello, " << g.name << " (job " << ctx.job().id << ")\n";
      greeted = true;
    });
    std::thread runner([&] { node.run(); });
    // The node migrates the schema; enqueue once it is there.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool enqueued = false;
    while (!greeted && std::chrono::steady_clock::now() < deadline) {
      if (!enqueued) {
        try {
          baton::Client(node.config().database_url, config.schema).enqueue(Greet{"standalone"});
          enqueued = true;
        } catch (const std::exception&) {
          // not migrated yet
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    node.stop();
    runner.join();
  } catch (const std::exception& e) {
    std::cerr << "standalone: " << e.what() << "\n";
    return 1;
  }
  std::cout << (greeted ? "standalone: the job was handled\n" : "standalone: no job handled\n");
  return greeted ? 0 : 1;
}
