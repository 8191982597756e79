# The CUDA toolkit the plugin needs, checked at configure time (CMakeLists.txt includes this file)
# and by a test (cmake -DMULTINORM_CUDA_FOUND=<version> -P scripts/cuda_version.cmake).
#   < 12.0: refused. The code calls CUDA 12's runtime API (cudaGraphInstantiate(exec, graph, flags),
#           kernels/cuda/cuda_queue.cu) and builds sm_90 code.
#   12.x:   a warning. It has compiled only with CUDA 13.0 (no CUDA 12 toolkit on the build machines).
set(MULTINORM_CUDA_MINIMUM 12.0)
set(MULTINORM_CUDA_TESTED 13.0)

function(multinorm_check_cuda_version found)
  if(found VERSION_LESS MULTINORM_CUDA_MINIMUM)
    message(FATAL_ERROR "multinorm: the CUDA toolkit found is ${found}; the CUDA plugin needs ${MULTINORM_CUDA_MINIMUM} or newer "
                        "(tested: ${MULTINORM_CUDA_TESTED}). Point CMAKE_CUDA_COMPILER at a newer nvcc, or build without the plugin: "
                        "-DMULTINORM_CUDA=OFF")
  elseif(found VERSION_LESS MULTINORM_CUDA_TESTED)
    message(WARNING "multinorm: the CUDA toolkit found is ${found}; the code has compiled only with ${MULTINORM_CUDA_TESTED} "
                    "(CUDA 12 is untested: run `multinorm doctor` on the node before training)")
  endif()
endfunction()

if(DEFINED MULTINORM_CUDA_FOUND)  # script mode: the test
  multinorm_check_cuda_version(${MULTINORM_CUDA_FOUND})
  message(STATUS "multinorm: CUDA ${MULTINORM_CUDA_FOUND} accepted")
endif()
