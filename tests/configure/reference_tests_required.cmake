# -DLOOM_REQUIRE_REFERENCE_TESTS=ON, as CI configures loom: a build without OpenMPI stops at
# configure time, naming it; with a Python environment that does not exist, the reference tests
# are still built, compiled to fail where they would skip, and ctest is given no way to mark them
# skipped. Without the option, the same tests skip. Configure only: nothing is built.
#
#   cmake -DLOOM_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P reference_tests_required.cmake
cmake_minimum_required(VERSION 3.25)

function(configure dir)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${LOOM_SOURCE_DIR} -B ${dir} -G ${GENERATOR} -DLOOM_BUILD_BENCHMARKS=OFF
                          ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc ${rc} PARENT_SCOPE)
  set(log "${out}${err}" PARENT_SCOPE)
endfunction()

include(${CMAKE_CURRENT_LIST_DIR}/../cmake/expect.cmake)

file(REMOVE_RECURSE ${WORK_DIR})

# 1. No mpirun: the data-parallel tests cannot be built, so configure fails saying so.
configure(${WORK_DIR}/no-mpi -DLOOM_REQUIRE_REFERENCE_TESTS=ON -DLOOM_MPIRUN=${WORK_DIR}/nowhere/mpirun)
if(rc EQUAL 0)
  message(FATAL_ERROR "configuring without mpirun under LOOM_REQUIRE_REFERENCE_TESTS succeeded:\n${log}")
endif()
expect_contains("${log}" "LOOM_REQUIRE_REFERENCE_TESTS: the data-parallel tests need OpenMPI's mpirun" "no mpirun")

# 2. A Python environment that does not exist: configure succeeds, and no reference test can skip.
set(required ${WORK_DIR}/required)
configure(${required} -DLOOM_REQUIRE_REFERENCE_TESTS=ON -DLOOM_PYTHON_ENV=${WORK_DIR}/no-python-env)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring with LOOM_REQUIRE_REFERENCE_TESTS failed:\n${log}")
endif()
set(ctest_files tests/interop tests/models tests/torch plugins/tokenizer/sentencepiece plugins/tokenizer/gpt2-bpe)
foreach(dir ${ctest_files})
  file(READ ${required}/${dir}/CTestTestfile.cmake tests)
  foreach(skip "transformers is not available" "peft is not available" "cannot import torch"
               "sentencepiece is not available")
    expect_lacks("${tests}" "${skip}" "${dir}: a reference test that may still skip")
  endforeach()
endforeach()
file(READ ${required}/plugins/tokenizer/gpt2-bpe/CTestTestfile.cmake tests)
string(REGEX MATCH "set_tests_properties\\(\\[=\\[tokenizer_hf_bpe_reference\\]=\\][^\n]*" hf_bpe "${tests}")
expect_lacks("${hf_bpe}" "SKIP_RETURN_CODE" "tokenizer_hf_bpe_reference may still skip")
file(READ ${required}/tests/CTestTestfile.cmake tests)
string(REGEX MATCH "set_tests_properties\\(\\[=\\[python_env\\]=\\][^\n]*" python_env "${tests}")
expect_lacks("${python_env}" "SKIP_RETURN_CODE" "python_env may still skip")
# The GoogleTest reference tests are compiled to fail where they would skip.
file(READ ${required}/compile_commands.json commands)
foreach(source tests/interop/peft_test.cpp tests/interop/hf_interop_test.cpp tests/models/hf_agreement_test.cpp
               tests/torch/torch_agreement_test.cpp tests/torch/dpo_agreement_test.cpp tests/io/safetensors_test.cpp
               tests/conformance/optimizer/optimizer_conformance_test.cpp
               plugins/tokenizer/sentencepiece/test/sentencepiece_test.cpp plugins/tokenizer/gpt2-bpe/test/hf_bpe_test.cpp
               plugins/tracker/tensorboard/tensorboard_test.cpp)
  string(REGEX MATCH "-DLOOM_REQUIRE_REFERENCE_TESTS=1[^\n]* -c [^\n]*/${source}\"" found "${commands}")
  if(NOT found)
    message(FATAL_ERROR "${source} is not compiled with LOOM_REQUIRE_REFERENCE_TESTS=1")
  endif()
endforeach()

# 3. Without the option the same tests skip, as before.
configure(${required} -DLOOM_REQUIRE_REFERENCE_TESTS=OFF)
file(READ ${required}/tests/interop/CTestTestfile.cmake tests)
expect_contains("${tests}" "SKIP_REGULAR_EXPRESSION \"peft is not available\"" "without the option")
file(READ ${required}/compile_commands.json commands)
expect_lacks("${commands}" "LOOM_REQUIRE_REFERENCE_TESTS=1" "without the option")

message(STATUS "LOOM_REQUIRE_REFERENCE_TESTS: configure refuses a build without OpenMPI; no reference test can skip")
