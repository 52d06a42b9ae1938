// Queue and type names, and the text cleaning applied to error messages before they are stored.
#include <gtest/gtest.h>

#include <baton/client.h>

#include "baton/detail/db.h"
#include "baton/detail/text.h"

namespace {

TEST(Names, AcceptsTheDocumentedCharacterSet) {
  for (const char* ok :
       {"default", "emails", "send_email", "billing.v2", "tenant:42", "a-b", "9"}) {
    EXPECT_NO_THROW(baton::detail::validate_name("queue", ok)) << ok;
  }
}

TEST(Names, RefusesOthersWithTheRule) {
  for (const char* bad : {"", "has space", "semi;colon", "quote'd", "\"; DROP TABLE jobs; --",
                          "_leading", "-leading", "caf\xc3\xa9"}) {
    try {
      baton::detail::validate_name("queue", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const baton::EnqueueError& e) {
      EXPECT_NE(std::string(e.what()).find("A-Z a-z 0-9"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(baton::detail::validate_name("type", std::string(65, 'a')), baton::EnqueueError);
}

TEST(CleanText, ReplacesNulAndInvalidUtf8AndCuts) {
  using baton::detail::clean_text;
  EXPECT_EQ(clean_text(std::string("a\0b", 3), 100), "a?b");
  EXPECT_EQ(clean_text("ok \xff\xfe end", 100), "ok ?? end");
  EXPECT_EQ(clean_text("caf\xc3\xa9", 100), "caf\xc3\xa9");
  EXPECT_EQ(clean_text("caf\xc3", 100), "caf?");
  EXPECT_EQ(clean_text("abcdef", 3), "abc");
  EXPECT_EQ(clean_text("ab\xc3\xa9", 3), "ab") << "never cuts inside a character";
}

}  // namespace
