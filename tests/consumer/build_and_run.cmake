# Run with cmake -P: install the torchdefer build tree into a scratch prefix, configure and build
# tests/consumer against that prefix only (plus LibTorch), and run the consumer.
file(REMOVE_RECURSE "${SCRATCH_DIR}")
set(prefix "${SCRATCH_DIR}/prefix")

function(run_step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "step failed (${result}): ${ARGV}")
  endif()
endfunction()

run_step("${CMAKE_COMMAND}" --install "${TORCHDEFER_BUILD_DIR}" --prefix "${prefix}")
set(launcher "")
find_program(CCACHE ccache)
if(CCACHE)
  set(launcher "-DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE}")
endif()
run_step("${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${SCRATCH_DIR}/build" -G "${GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${TORCH_DIR}" ${launcher})
run_step("${CMAKE_COMMAND}" --build "${SCRATCH_DIR}/build")
run_step("${SCRATCH_DIR}/build/consumer")
