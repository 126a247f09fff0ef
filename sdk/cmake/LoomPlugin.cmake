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
