// Runs a baton::Node on a thread of the test process and stops it when it goes out of scope.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include <baton/baton.h>

#include "support/support.h"

namespace baton::test {

// A config for an in-process node on `schema`: no signals, no metrics port, fast polling and
// fast retries, so tests wait for states in milliseconds.
inline NodeConfig test_config(const std::string& schema, const std::string& node_id) {
  NodeConfig c;
  c.database_url = database_url();
  c.schema = schema;
  c.node_id = node_id;
  c.threads = 4;
  c.metrics_listen = "off";
  c.handle_signals = false;
  c.poll_interval = std::chrono::milliseconds(100);
  c.retry_base = std::chrono::milliseconds(5);
  c.retry_cap = std::chrono::milliseconds(50);
  return c;
}

class RunningNode {
 public:
  RunningNode(NodeConfig config, const std::function<void(Node&)>& setup) : node_(config) {
    setup(node_);
    thread_ = std::thread([this] {
      try {
        node_.run();
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    });
  }
  ~RunningNode() {
    node_.stop();
    thread_.join();
  }
  Node& node() { return node_; }
  const std::string& error() const { return error_; }

 private:
  Node node_;
  std::string error_;
  std::thread thread_;
};

}  // namespace baton::test
