# Installs loom from the build tree into a fresh prefix, builds the installed copy of
# sdk/examples/exponential-decay (<prefix>/share/loom/examples) against that installed tree
# (find_package(Loom), never the build tree or the source tree) with no build type given, and
# checks that it built as Release and that the installed `loom` lists the plugin and validates a
# config that selects it. A plugin that calls BLAS links the BLAS find_package(Loom) exports. Then
# builds the installed out-of-tree attention kernel and optimizer the same way and runs their
# conformance tests (loom_add_conformance_test: the installed `loom conformance` against the
# installed oracles).
#
#   cmake -DLOOM_BUILD_DIR=... -DLOOM_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P out_of_tree_plugin.cmake
cmake_minimum_required(VERSION 3.25)

function(run)
  cmake_parse_arguments(ARG "" "EXPECT;OUTPUT_VARIABLE" "COMMAND;ENV" ${ARGN})
  if(NOT DEFINED ARG_EXPECT)
    set(ARG_EXPECT 0)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ARG_ENV} ${ARG_COMMAND}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL ARG_EXPECT)
    message(FATAL_ERROR "`${ARG_COMMAND}` exited ${rc}, expected ${ARG_EXPECT}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  if(ARG_OUTPUT_VARIABLE)
    set(${ARG_OUTPUT_VARIABLE} "${out}${err}" PARENT_SCOPE)
  endif()
endfunction()

include(${CMAKE_CURRENT_LIST_DIR}/../cmake/expect.cmake)

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
set(example_build ${WORK_DIR}/example-build)

# 1. Install.
run(COMMAND ${CMAKE_COMMAND} --install ${LOOM_BUILD_DIR} --prefix ${prefix})
foreach(f bin/loom lib/libloom_core.so lib/libloom_run.so include/loom/plugin.hpp include/loom/version.hpp
          include/loom/attention_mask.hpp
          lib/cmake/Loom/LoomConfig.cmake lib/cmake/Loom/LoomTargets.cmake lib/cmake/Loom/LoomPlugin.cmake
          lib/loom/loom-conformance lib/loom/plugins/libloom-backend-reference.so
          lib/loom/plugins/libloom-attention-naive.so share/loom/conformance/optimizer/index.json
          share/loom/examples/exponential-decay/CMakeLists.txt share/loom/examples/exponential-decay/example.yaml
          share/loom/examples/streaming-attention/streaming_attention.cpp share/loom/examples/rmsprop/rmsprop.cpp)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()
# The SDK is for plugins: the core's own API and the run layer's headers stay out of it.
foreach(d include/loom/core include/loom/run)
  if(EXISTS ${prefix}/${d})
    message(FATAL_ERROR "install has ${d}, which is not part of the plugin SDK")
  endif()
endforeach()

# 2. Configure and build the installed example against the installed tree only, as
# docs/writing-a-plugin.md shows: no build type given, so find_package(Loom) makes it Release.
set(examples ${prefix}/share/loom/examples)
run(COMMAND ${CMAKE_COMMAND} -S ${examples}/exponential-decay -B ${example_build}
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
    OUTPUT_VARIABLE configure_log)
file(READ ${example_build}/CMakeCache.txt cache)
expect_contains("${cache}" "Loom_DIR:PATH=${prefix}/lib/cmake/Loom" "the example must find the installed Loom")
expect_contains("${cache}" "CMAKE_BUILD_TYPE:STRING=Release" "no build type given: find_package(Loom) chooses Release")
expect_contains("${configure_log}" "Loom: no CMAKE_BUILD_TYPE given, so plugins build as Release" "the Release note")
run(COMMAND ${CMAKE_COMMAND} --build ${example_build} -- -v OUTPUT_VARIABLE build_log)
expect_contains("${build_log}" "-O3" "the example is compiled with optimisation")
set(plugin ${example_build}/libloom-lr_schedule-exponential.so)
if(NOT EXISTS ${plugin})
  message(FATAL_ERROR "the example did not produce ${plugin}")
endif()

# 3. Its only exported symbols are the two entry points.
find_program(NM nm)
if(NM)
  run(COMMAND ${NM} -D --defined-only ${plugin} OUTPUT_VARIABLE symbols)
  string(REGEX MATCHALL "[^\n]+" lines "${symbols}")
  foreach(line ${lines})
    if(line MATCHES " [TDBRVWu] " AND NOT line MATCHES "loom_plugin_(abi|register)$")
      message(FATAL_ERROR "the plugin exports more than its entry points:\n${symbols}")
    endif()
  endforeach()
  expect_contains("${symbols}" "loom_plugin_abi" "exported symbols")
  expect_contains("${symbols}" "loom_plugin_register" "exported symbols")
endif()

# 4. The installed loom lists it, found through LOOM_PLUGIN_PATH.
set(env LOOM_PLUGIN_PATH=${example_build})
run(COMMAND ${prefix}/bin/loom plugins ENV ${env} OUTPUT_VARIABLE listing)
expect_contains("${listing}" "exponential" "loom plugins")
expect_contains("${listing}" "1.0.0" "loom plugins")
expect_contains("${listing}" "${plugin}" "loom plugins")

# 5. A config selecting it validates its options, defaults filled in.
run(COMMAND ${prefix}/bin/loom config show ${examples}/exponential-decay/example.yaml
    ENV ${env} OUTPUT_VARIABLE shown)
expect_contains("${shown}" "type: exponential\n  decay_rate: 0.9\n  decay_steps: 500\n  staircase: false" "config show")

# ...and an invalid option is refused with the option named, exit status 2.
run(COMMAND ${prefix}/bin/loom config show ${examples}/exponential-decay/example.yaml
    lr_schedule.decay_rate=1.5 ENV ${env} EXPECT 2 OUTPUT_VARIABLE refused)
expect_contains("${refused}" "lr_schedule.decay_rate: expected a number in (0, 1], got 1.5 (out of range)" "range check")
run(COMMAND ${prefix}/bin/loom config show ${examples}/exponential-decay/example.yaml
    lr_schedule.decay_step=3 ENV ${env} EXPECT 2 OUTPUT_VARIABLE refused)
expect_contains("${refused}" "did you mean 'decay_steps'?" "unknown option")

# 5b. A plugin that calls BLAS, as docs/attention-kernels.md shows: BLAS_LIBRARIES and Loom::blas
# name the BLAS loom was built with, and the plugin links it.
set(blas_source ${LOOM_SOURCE_DIR}/tests/sdk/blas_plugin)
run(COMMAND ${CMAKE_COMMAND} -S ${blas_source} -B ${WORK_DIR}/blas-build -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON OUTPUT_VARIABLE blas_log)
expect_contains("${blas_log}" "BLAS_LIBRARIES=/" "BLAS_LIBRARIES after find_package(Loom)")
run(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/blas-build)
find_program(READELF readelf)
if(READELF)
  foreach(name blasdot blasdot_target)
    run(COMMAND ${READELF} -d ${WORK_DIR}/blas-build/libloom-lr_schedule-${name}.so OUTPUT_VARIABLE dynamic)
    expect_contains("${dynamic}" "libopenblas" "the ${name} plugin links loom's BLAS")
  endforeach()
endif()
run(COMMAND ${prefix}/bin/loom plugins ENV LOOM_PLUGIN_PATH=${WORK_DIR}/blas-build OUTPUT_VARIABLE listing)
expect_contains("${listing}" "blasdot_target" "loom plugins lists the BLAS plugins")
expect_lacks("${listing}" "failed to load" "the BLAS plugins load")

# 6. The out-of-tree attention kernel: built against the install, its conformance test (every
# case of the attention suite against the installed `naive`) passes under ctest.
function(build_and_check_conformance example plugin_file)
  set(build ${WORK_DIR}/${example}-build)
  run(COMMAND ${CMAKE_COMMAND} -S ${examples}/${example} -B ${build}
      -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
  file(READ ${build}/CMakeCache.txt cache)
  expect_contains("${cache}" "Loom_DIR:PATH=${prefix}/lib/cmake/Loom" "${example} must find the installed Loom")
  run(COMMAND ${CMAKE_COMMAND} --build ${build})
  if(NOT EXISTS ${build}/${plugin_file})
    message(FATAL_ERROR "${example} did not produce ${plugin_file}")
  endif()
  run(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${build} --output-on-failure -V OUTPUT_VARIABLE log)
  expect_contains("${log}" "Test command: ${prefix}/bin/loom \"conformance\" \"${build}/${plugin_file}\""
                  "${example}'s test runs the installed loom on its plugin")
  expect_contains("${log}" "100% tests passed" "${example}'s conformance test")
  set(conformance_log "${log}" PARENT_SCOPE)
endfunction()

build_and_check_conformance(streaming-attention libloom-attention-streaming.so)
expect_contains("${conformance_log}" "oracles: ${prefix}/lib/loom/plugins/libloom-backend-reference.so, ${prefix}/lib/loom/plugins/libloom-attention-naive.so" "installed oracles")
expect_contains("${conformance_log}" "[       OK ] AttentionConformance.EveryKernelMatchesNaive" "the attention suite")

# 7. The out-of-tree optimizer: the optimizer contract, and ten steps of torch.optim.RMSprop
# recorded at loom's build time (skipped, saying why, where PyTorch was not installed).
build_and_check_conformance(rmsprop libloom-optimizer-rmsprop.so)
expect_contains("${conformance_log}" "[       OK ] EveryOptimizer.RestoringSavedStateContinuesBitForBit" "the optimizer suite")
file(READ ${prefix}/share/loom/conformance/optimizer/index.json torch_index)
if(torch_index MATCHES "\"skipped\"")
  expect_contains("${conformance_log}" "[  SKIPPED ] Registered/AgreesWithPyTorch.StepByStep/rmsprop" "no PyTorch")
else()
  expect_contains("${conformance_log}" "[ torch    ] rmsprop_l2" "the PyTorch replay")
  expect_contains("${conformance_log}" "[       OK ] Registered/AgreesWithPyTorch.StepByStep/rmsprop" "the PyTorch replay")
endif()

message(STATUS "out-of-tree plugins built against ${prefix}, loaded and checked by the installed loom")
