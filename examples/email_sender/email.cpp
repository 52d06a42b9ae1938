// SendEmail handler: validates, renders and "delivers" into an outbox directory.
#include "email_sender/email.h"

#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

namespace email {

void to_json(nlohmann::json& j, const SendEmail& e) {
  j = nlohmann::json{{"to", e.to}, {"subject", e.subject}, {"body", e.body}};
}

void from_json(const nlohmann::json& j, SendEmail& e) {
  j.at("to").get_to(e.to);
  j.at("subject").get_to(e.subject);
  e.body = j.value("body", "");
}

void register_handlers(baton::Node& node, const std::string& outbox_dir) {
  if (!outbox_dir.empty()) std::filesystem::create_directories(outbox_dir);
  node.handle<SendEmail>(
      SendEmail::type_name, [outbox_dir](baton::JobContext& ctx, const SendEmail& mail) {
        if (mail.to.find('@') == std::string::npos) {
          throw baton::Discard("address '" + mail.to + "' has no '@'; fix the producer");
        }
        if (mail.to.ends_with(".invalid")) {
          throw std::runtime_error("mail server for '" + mail.to + "' is unreachable");
        }
        if (outbox_dir.empty()) {
          spdlog::debug("email to {}: {}", mail.to, mail.subject);
          return;
        }
        const auto id = std::to_string(ctx.job().id);
        const auto final_path = std::filesystem::path(outbox_dir) / (id + ".eml");
        const auto tmp_path = std::filesystem::path(outbox_dir) / (id + ".eml.tmp");
        {
          std::ofstream out(tmp_path, std::ios::trunc);
          out << "To: " << mail.to << "\r\nSubject: " << mail.subject
              << "\r\nX-Baton-Key: " << ctx.idempotency_key() << "\r\n\r\n"
              << mail.body << "\r\n";
          if (!out) throw std::runtime_error("cannot write " + tmp_path.string());
        }
        std::filesystem::rename(tmp_path, final_path);
      });
}

}  // namespace email
