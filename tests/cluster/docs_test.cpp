// The docs promise what the binaries do: every setting in docs/configuration.md exists in
// `batond --help`, and every option of --help is in the reference.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "support/testkit.h"

namespace {

using namespace baton::test;

std::set<std::string> flags_in(const std::string& text, const std::regex& pattern) {
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), pattern), end; it != end; ++it) {
    out.insert((*it)[1].str());
  }
  return out;
}

TEST(Docs, TheConfigurationReferenceAndBatondHelpListTheSameSettings) {
  std::ifstream in(std::string(BATON_SOURCE_DIR) + "/docs/configuration.md");
  std::stringstream doc;
  doc << in.rdbuf();
  // Reference rows start with "| `--flag` |".
  const auto documented = flags_in(doc.str(), std::regex(R"(\n\| `--([a-z-]+)` \|)"));
  std::string help;
  ASSERT_EQ(run_command(binary("batond") + " --help", &help), 0) << help;
  auto offered = flags_in(help, std::regex(R"(\n  --([a-z-]+))"));
  offered.erase("help");
  for (const auto& f : offered) {
    EXPECT_TRUE(documented.count(f) == 1) << "--" << f << " is in --help but not in docs";
  }
  for (const auto& f : documented) {
    EXPECT_TRUE(offered.count(f) == 1) << "--" << f << " is documented but batond has no such flag";
  }
  EXPECT_GT(documented.size(), 20u);
}

}  // namespace
