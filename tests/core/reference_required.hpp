// Checks against a reference (PyTorch, transformers, PEFT, tokenizers, sentencepiece) skip, saying
// why, where the reference is missing. A build configured with -DLOOM_REQUIRE_REFERENCE_TESTS=ON
// (CI) compiles its reference tests with LOOM_REQUIRE_REFERENCE_TESTS=1 (CMake's
// loom_reference_test_target): there each such skip is a failure naming what is missing instead,
// so that a run can never pass with the reference checks unchecked.
#pragma once

#include <gtest/gtest.h>

#include <string>

#ifndef LOOM_REQUIRE_REFERENCE_TESTS
#define LOOM_REQUIRE_REFERENCE_TESTS 0
#endif

namespace loom::test {

inline constexpr bool reference_tests_required = LOOM_REQUIRE_REFERENCE_TESTS != 0;

// Skips the current test because its reference is missing (`why`), or, where the build requires
// the reference tests, fails it with that reason. Called as `return skip_missing_reference(why);`
// from a test body, SetUp() or a helper they return from: the skip or the fatal failure is the
// test's, so neither the rest of the body nor, from SetUp(), the body runs.
inline void skip_missing_reference(const std::string& why, bool required = reference_tests_required) {
  if (required)
    GTEST_FAIL() << "this build requires every reference check (-DLOOM_REQUIRE_REFERENCE_TESTS=ON), and this one "
                    "cannot run: "
                 << why;
  GTEST_SKIP() << why;
}

}  // namespace loom::test
