// The email example: a typed SendEmail job, delivered by writing one .eml file per job into an
// outbox directory. The file is named by job id and written with a rename, so a job that runs
// twice (after a failover) still leaves exactly one message: the effect is idempotent.
#pragma once

#include <string>

#include <baton/baton.h>

namespace email {

struct SendEmail {
  static constexpr const char* type_name = "send_email";
  std::string to;
  std::string subject;
  std::string body;
};

void to_json(nlohmann::json& j, const SendEmail& e);
void from_json(const nlohmann::json& j, SendEmail& e);

// Registers "send_email". An address without '@' is discarded (dead at once, no retries);
// an address ending in ".invalid" fails like an unreachable mail server (retried, then dead).
// With an empty outbox the message is only logged.
void register_handlers(baton::Node& node, const std::string& outbox_dir);

}  // namespace email
