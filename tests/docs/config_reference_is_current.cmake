# Fails when docs/config-reference.md differs from `loom config schema --markdown` over the
# built plugins, so the reference cannot drift from the code.
execute_process(COMMAND ${LOOM} config schema --markdown --no-default-plugin-path --plugin-path ${PLUGIN_DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE generated ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "loom config schema --markdown failed (${rc}): ${err}")
endif()
file(READ ${REFERENCE} committed)
# Sections of plugins this build does not have (the cuda backend without a CUDA toolkit): the
# reference is generated on a build with every plugin, so they are left out of the comparison.
# ABSENT_SECTIONS lists them separated by commas.
string(REPLACE "," ";" ABSENT_SECTIONS "${ABSENT_SECTIONS}")
foreach(section ${ABSENT_SECTIONS})
  string(FIND "${committed}" "### ${section}\n" begin)
  if(begin GREATER_EQUAL 0)
    math(EXPR after "${begin} + 4")
    string(SUBSTRING "${committed}" ${after} -1 rest)
    string(FIND "${rest}" "\n#" next)
    string(SUBSTRING "${committed}" 0 ${begin} head)
    if(next GREATER_EQUAL 0)
      math(EXPR next "${next} + 1")
      string(SUBSTRING "${rest}" ${next} -1 tail)
    else()
      set(tail "")
    endif()
    set(committed "${head}${tail}")
  endif()
endforeach()
if(NOT generated STREQUAL committed)
  message(FATAL_ERROR "docs/config-reference.md is out of date: run scripts/update-config-reference.sh")
endif()
