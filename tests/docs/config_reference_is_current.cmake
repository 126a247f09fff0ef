# Fails when docs/config-reference.md differs from `loom config schema --markdown` over the
# built plugins, so the reference cannot drift from the code.
execute_process(COMMAND ${LOOM} config schema --markdown --no-default-plugin-path --plugin-path ${PLUGIN_DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE generated ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "loom config schema --markdown failed (${rc}): ${err}")
endif()
file(READ ${REFERENCE} committed)
if(NOT generated STREQUAL committed)
  message(FATAL_ERROR "docs/config-reference.md is out of date: run scripts/update-config-reference.sh")
endif()
