// Fuzzes what a typed handler does with a payload: parse the JSON and map it to the type. Bad
// input must end in the exceptions the node turns into a dead-lettered job, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct SendEmail {
  std::string to, subject;
  int retries = 0;
};
void from_json(const nlohmann::json& j, SendEmail& e) {
  j.at("to").get_to(e.to);
  j.at("subject").get_to(e.subject);
  e.retries = j.value("retries", 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto j = nlohmann::json::parse(text);
    [[maybe_unused]] const auto mail = j.get<SendEmail>();
    [[maybe_unused]] const auto back = j.dump();
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
