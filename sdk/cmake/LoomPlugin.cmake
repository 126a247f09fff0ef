# loom_add_plugin(NAME SOURCES src... [LIBRARIES lib...] [INSTALL_DIR dir])
#
# Builds a loom plugin: a MODULE library named libloom-<NAME>.so (NAME is "<kind>-<name>", for
# example "optimizer-adamw"), compiled with hidden visibility so that it exports only the two
# entry points LOOM_PLUGIN declares, linked to the loom core, and installed into the plugin
# directory. Works in loom's own tree and, through find_package(Loom), out of tree.
include_guard(GLOBAL)

function(loom_add_plugin name)
  cmake_parse_arguments(ARG "" "INSTALL_DIR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "loom_add_plugin(${name}): no SOURCES given")
  endif()
  if(NOT name MATCHES "^[a-z][a-z0-9_]*-[a-z0-9_.-]+$")
    message(FATAL_ERROR "loom_add_plugin(${name}): NAME must read <kind>-<name>, e.g. optimizer-adamw")
  endif()
  if(NOT ARG_INSTALL_DIR)
    if(DEFINED LOOM_INSTALL_PLUGINDIR)
      set(ARG_INSTALL_DIR ${LOOM_INSTALL_PLUGINDIR})
    else()
      set(ARG_INSTALL_DIR lib/loom/plugins)
    endif()
  endif()

  add_library(${name} MODULE ${ARG_SOURCES})
  if(TARGET loom_core)
    target_link_libraries(${name} PRIVATE loom_core ${ARG_LIBRARIES})
  else()
    target_link_libraries(${name} PRIVATE Loom::loom_core ${ARG_LIBRARIES})
  endif()
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "libloom-${name}"
    SUFFIX ".so"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(DEFINED LOOM_PLUGIN_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY ${LOOM_PLUGIN_OUTPUT_DIRECTORY}
      INSTALL_RPATH "$ORIGIN/../..")
  elseif(DEFINED Loom_LIBRARY_DIR)
    set_target_properties(${name} PROPERTIES INSTALL_RPATH "${Loom_LIBRARY_DIR}")
  endif()
  install(TARGETS ${name} LIBRARY DESTINATION ${ARG_INSTALL_DIR})
endfunction()

# loom_add_conformance_test(TARGET [NAME test] [ARGS arg...])
#
# Registers a CTest test (default name <TARGET>-conformance, label `conformance`) that runs
# `loom conformance $<TARGET_FILE:TARGET>`: loom's conformance suites for every backend,
# attention kernel and optimizer the plugin registers, against the oracles installed with loom
# (the `reference` backend, the `naive` attention kernel, PyTorch's recorded optimizer
# trajectories). ARGS go to the command (GoogleTest options such as --gtest_filter=...). The
# project calls enable_testing() (or include(CTest)) first.
function(loom_add_conformance_test target)
  cmake_parse_arguments(ARG "" "NAME" "ARGS" ${ARGN})
  if(NOT TARGET ${target})
    message(FATAL_ERROR "loom_add_conformance_test(${target}): no such target (call loom_add_plugin first)")
  endif()
  if(NOT ARG_NAME)
    set(ARG_NAME ${target}-conformance)
  endif()
  if(TARGET loom)
    set(loom_command $<TARGET_FILE:loom>)
  elseif(DEFINED Loom_EXECUTABLE)
    set(loom_command ${Loom_EXECUTABLE})
  else()
    message(FATAL_ERROR "loom_add_conformance_test(${target}): the `loom` command is unknown (find_package(Loom) sets Loom_EXECUTABLE)")
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${loom_command} conformance $<TARGET_FILE:${target}> ${ARG_ARGS})
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS conformance)
endfunction()
