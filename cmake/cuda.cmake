# The CUDA backend: target loom_backend_cuda, the file libloom_cuda.so, loaded at run time by the
# backend registry (src/core/backend.cpp) so that programs built with CUDA still start on
# machines without a GPU driver.
#
# Included from the top CMakeLists.txt once CUDA is enabled (CMAKE_CUDA_ARCHITECTURES set there).

option(LOOM_CUDA_PTXAS_VERBOSE "Print ptxas register/shared-memory usage for every CUDA kernel (-Xptxas -v)" OFF)
option(LOOM_CUDA_LINEINFO "Keep source line info in CUDA kernels (for Nsight Compute, compute-sanitizer)" OFF)

# What every target compiling backend .cu files shares: warnings, the export macro's side, and the
# ptxas / line-info switches above.
function(loom_cuda_kernel_options target)
  target_compile_definitions(${target} PRIVATE LOOM_CUDA_BUILDING=1)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
  if(LOOM_CUDA_PTXAS_VERBOSE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
  if(LOOM_CUDA_LINEINFO)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  endif()
endfunction()

add_library(loom_backend_cuda SHARED
  src/backend/cuda/cuda_register.cpp
  src/backend/cuda/cuda_ops.cpp
  src/backend/cuda/cuda_device.cpp
  src/backend/cuda/cuda_exec.cpp
  src/backend/cuda/cuda_nccl.cpp
  src/backend/cuda/kernels/elementwise.cu
  src/backend/cuda/kernels/norm.cu
  src/backend/cuda/kernels/softmax.cu
  src/backend/cuda/kernels/reduce.cu
  src/backend/cuda/kernels/sample.cu
  src/backend/cuda/kernels/copy.cu
  src/backend/cuda/kernels/matmul.cu
  src/backend/cuda/kernels/gemm_q.cu
  src/backend/cuda/kernels/mat_vec_fast.cu
  src/backend/cuda/kernels/rope.cu
  src/backend/cuda/kernels/attention.cu
  src/backend/cuda/kernels/attention_mma.cu
  src/backend/cuda/kernels/attention_decode.cu
  src/backend/cuda/kernels/fused.cu
  src/backend/cuda/kernels/allreduce.cu
)
# gemm_q's warpgroup kernel (wgmma) is sm_90a code: an object library of its own, so the rest keeps
# the plain sm_90 target (and its PTX for later GPUs); it runs only on compute capability 9.0
# (gemm_q_wgmma_available).
add_library(loom_cuda_sm90a OBJECT src/backend/cuda/kernels/gemm_q_wgmma.cu
            src/backend/cuda/kernels/attention_wgmma.cu)
target_include_directories(loom_cuda_sm90a PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src/backend/cuda)
target_link_libraries(loom_cuda_sm90a PRIVATE CUDA::cudart fmt::fmt loom_options)
set_target_properties(loom_cuda_sm90a PROPERTIES
  CUDA_ARCHITECTURES 90a
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  POSITION_INDEPENDENT_CODE ON
  CXX_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
loom_cuda_kernel_options(loom_cuda_sm90a)
target_sources(loom_backend_cuda PRIVATE $<TARGET_OBJECTS:loom_cuda_sm90a>)
# include/ is public for programs that link loom_backend_cuda to call include/loom/cuda.h directly.
target_include_directories(loom_backend_cuda PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src/backend/cuda)
# loom_core is static and linked into this library too; its symbols stay private here
# (--exclude-libs), so the library never binds to the program's copy or the other way round.
# Registration goes through the function pointer the program passes to loom_backend_register.
target_link_libraries(loom_backend_cuda PRIVATE loom_core loom_exec CUDA::cudart CUDA::cublas nlohmann_json::nlohmann_json
                      loom_options)
target_link_options(loom_backend_cuda PRIVATE -Wl,--exclude-libs,ALL)
if(NOT LOOM_SANITIZE)
  # every symbol resolved at link time (sanitizer runtimes resolve theirs at load time instead)
  target_link_options(loom_backend_cuda PRIVATE -Wl,--no-undefined)
endif()
set_target_properties(loom_backend_cuda PROPERTIES
  CUDA_STANDARD 17  # CMake 3.25 does not know nvcc 13's C++20 flag; the .cu files need only C++17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Shared
  CXX_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin
  OUTPUT_NAME loom_cuda  # the registry looks for libloom_cuda.so (src/core/backend.cpp)
)
# Only the entry points marked LOOM_CUDA_API are exported (see include/loom/cuda.h).
loom_cuda_kernel_options(loom_backend_cuda)

# ---- loom_capi_cuda: the CUDA C ABI (include/loom-cuda.h), libloom_capi_cuda.so -----------------------
# Above the C++ API, like loom_capi: it reaches the backend only through include/loom/cuda.h and the
# executor's extension (loom/exec.h), so nothing in the backend includes the C ABI. It builds on
# loom.h's library (one last-error slot and one graph handle for both); public, since C programs
# calling loom-cuda.h use loom.h too. Its own loom_core and loom_exec stay private (--exclude-libs).
add_library(loom_capi_cuda SHARED ${PROJECT_SOURCE_DIR}/src/capi/cuda_seed_api.cpp)
target_include_directories(loom_capi_cuda PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src/capi)
target_link_libraries(loom_capi_cuda PUBLIC loom_capi
                      PRIVATE loom_backend_cuda loom_core loom_exec CUDA::cudart loom_options)
target_link_options(loom_capi_cuda PRIVATE -Wl,--exclude-libs,ALL)
if(NOT LOOM_SANITIZE)
  target_link_options(loom_capi_cuda PRIVATE -Wl,--no-undefined)
endif()
set_target_properties(loom_capi_cuda PROPERTIES
  CUDA_RUNTIME_LIBRARY Shared
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin
)
