# Assertions shared by the tests that are CMake scripts (cmake -P): each fails the test with what
# was expected and the text it was looked for in.
include_guard(GLOBAL)

function(expect_contains text needle what)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: expected to find\n  ${needle}\nin\n${text}")
  endif()
endfunction()

function(expect_lacks text needle what)
  string(FIND "${text}" "${needle}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${what}: did not expect\n  ${needle}\nin\n${text}")
  endif()
endfunction()
