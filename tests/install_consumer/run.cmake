# Installs the build tree into WORK_DIR/prefix, then configures, builds and runs two
# consumers: one of the whole package, and one of the allocator component alone (plus
# events, metrics and remote when built), with the CUDA toolkit and fmt made unfindable to prove
# they need neither.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: '${ARGV}' failed with ${rc}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
set(cuda_arg)
if(CUDA_COMPILER)
  set(cuda_arg -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
  -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${cuda_arg})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
foreach(optional events_consumer remote_consumer)
  if(EXISTS ${WORK_DIR}/build/${optional})
    run(${WORK_DIR}/build/${optional})
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build-allocator
  -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DALLOCATOR_ONLY=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-allocator)
run(${WORK_DIR}/build-allocator/consumer)
foreach(optional events_consumer remote_consumer)
  if(EXISTS ${WORK_DIR}/build-allocator/${optional})
    run(${WORK_DIR}/build-allocator/${optional})
  endif()
endforeach()
