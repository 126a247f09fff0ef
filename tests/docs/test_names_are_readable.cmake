# ctest's test names are readable: every parameterised suite names its cases (a name generator,
# so no "Suite.Test/3"), and no name carries gtest's print of a parameter it cannot show
# ("# GetParam() = 64-byte object <60-94 B3 ...>": gtest_discover_tests' NO_PRETTY_VALUES).
#   cmake -DCTEST=... -DBUILD_DIR=... -P test_names_are_readable.cmake
execute_process(COMMAND ${CTEST} --test-dir ${BUILD_DIR} -N OUTPUT_VARIABLE listing RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "ctest -N failed (${status}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(bad "")
set(count 0)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^ *Test +#[0-9]+: (.*)$")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  math(EXPR count "${count} + 1")
  if(name MATCHES "GetParam|byte object|/[0-9]+$")
    string(APPEND bad "\n  ${name}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "test names that show a parameter's bytes or only its index (give the suite a name "
                      "generator, INSTANTIATE_TEST_SUITE_P's fourth argument, and its gtest_discover_tests "
                      "NO_PRETTY_VALUES):${bad}")
endif()
if(count EQUAL 0)
  message(FATAL_ERROR "ctest -N listed no test in ${BUILD_DIR}:\n${listing}")
endif()
message(STATUS "${count} test names, all readable")
