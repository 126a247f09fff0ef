# No test, config, doc or build file points outside the repository for its data: a fresh clone
# (which has no shared data directory beside it) runs and documents everything with what it holds. GPT-2's
# vocabulary and the Shakespeare corpus ship in configs/data.
#   cmake -DLOOM_SOURCE_DIR=... -P nothing_outside_the_repository.cmake
cmake_policy(SET CMP0053 NEW)
# The patterns are spelt in two pieces, so that this file does not find itself.
set(patterns "../sha" "red" "SHARED_DATA" "_DIR")
list(GET patterns 0 a)
list(GET patterns 1 b)
list(GET patterns 2 c)
list(GET patterns 3 d)
set(needles "${a}${b}" "LOOM_${c}${d}")
file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE ${LOOM_SOURCE_DIR}
  ${LOOM_SOURCE_DIR}/apps/* ${LOOM_SOURCE_DIR}/benchmarks/* ${LOOM_SOURCE_DIR}/configs/*.yaml
  ${LOOM_SOURCE_DIR}/configs/*.md ${LOOM_SOURCE_DIR}/configs/*.py ${LOOM_SOURCE_DIR}/core/* ${LOOM_SOURCE_DIR}/docs/*
  ${LOOM_SOURCE_DIR}/plugins/* ${LOOM_SOURCE_DIR}/scripts/* ${LOOM_SOURCE_DIR}/sdk/* ${LOOM_SOURCE_DIR}/tests/*)
list(APPEND files CMakeLists.txt README.md)
set(found "")
set(count 0)
foreach(file IN LISTS files)
  if(NOT file MATCHES "(\\.(cpp|hpp|h|cu|cmake|in|md|yaml|py|sh)|CMakeLists\\.txt)$")
    continue()
  endif()
  math(EXPR count "${count} + 1")
  file(READ ${LOOM_SOURCE_DIR}/${file} text)
  foreach(needle IN LISTS needles)
    string(FIND "${text}" "${needle}" at)
    if(NOT at EQUAL -1)
      string(APPEND found "\n  ${file}: ${needle}")
    endif()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "these files point outside the repository for data (a fresh clone has none there; "
                      "use what configs/data holds, LOOM_DATA_DIR in the tests):${found}")
endif()
message(STATUS "${count} files read, none points outside the repository")
