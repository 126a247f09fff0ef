// -DLOOM_REQUIRE_REFERENCE_TESTS=ON: a reference check whose reference is missing fails, naming
// what is missing, instead of skipping (reference_required.hpp).
#include "reference_required.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

namespace loom::test {
namespace {

TEST(ReferenceRequired, AMissingReferenceFailsWhereTheBuildRequiresIt) {
  // Fatal: from SetUp(), the test body does not run on a reference that is not there.
  EXPECT_FATAL_FAILURE(
      skip_missing_reference("transformers is not available: no Python environment at /nowhere", true),
      "-DLOOM_REQUIRE_REFERENCE_TESTS=ON), and this one cannot run: transformers is not available: no Python "
      "environment at /nowhere");
}

}  // namespace
}  // namespace loom::test
