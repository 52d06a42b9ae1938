// The test programs' main: Google Test, and the temporary directories of the tests (node logs,
// certificates, configuration files) and their schemas and roles in the test database removed
// when every test passed, or kept and named when one failed.
#include <gtest/gtest.h>

#include "support/support.h"
#include "support/testkit.h"

namespace {

class TempDirsAtTheEnd : public testing::EmptyTestEventListener {
  void OnTestProgramEnd(const testing::UnitTest& unit) override {
    if (unit.Passed()) {
      baton::test::remove_temp_dirs();
    } else {
      baton::test::keep_temp_dirs();
    }
    baton::test::end_tracked_schemas(unit.Passed());
  }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new TempDirsAtTheEnd);
  return RUN_ALL_TESTS();
}
