# CUDA configuration for `CMAKE_ARGS="-DGGML_CUDA=on" pip install .`
#
# ggml-cuda is configured by upstream exactly as llama-cpp-python does it; this
# file only fills two gaps of build machines without a GPU or without cuBLAS:
# - CMAKE_CUDA_ARCHITECTURES: upstream defaults to "native", which fails when no
#   GPU is visible; then we build for Ampere and Hopper (80;90) unless told.
# - cuBLAS: a toolkit without it (nvcc alone) can use the PyPI wheel
#   nvidia-cublas: point RIDGEFILL_CUBLAS_ROOT (CMake or environment) at the
#   folder holding its include/ and lib/ (scripts/fetch_cublas.py prepares one).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _rf_smi OUTPUT_QUIET ERROR_QUIET)
    if(NOT _rf_smi EQUAL 0)
        set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures (no GPU visible at configure time)")
        message(STATUS "RidgeFill: no GPU visible, building CUDA code for sm_80/sm_90")
    endif()
endif()

if(NOT DEFINED RIDGEFILL_CUBLAS_ROOT AND DEFINED ENV{RIDGEFILL_CUBLAS_ROOT})
    set(RIDGEFILL_CUBLAS_ROOT $ENV{RIDGEFILL_CUBLAS_ROOT})
endif()
if(RIDGEFILL_CUBLAS_ROOT)
    foreach(_lib cublas cublasLt)
        file(GLOB _found ${RIDGEFILL_CUBLAS_ROOT}/lib/lib${_lib}.so*)
        if(NOT _found)
            message(FATAL_ERROR "RidgeFill: RIDGEFILL_CUBLAS_ROOT=${RIDGEFILL_CUBLAS_ROOT} has no lib/lib${_lib}.so*")
        endif()
        list(GET _found 0 _found)
        set(CUDA_${_lib}_LIBRARY ${_found} CACHE FILEPATH "" FORCE)
    endforeach()
    set(RIDGEFILL_CUBLAS_INCLUDE ${RIDGEFILL_CUBLAS_ROOT}/include)
    message(STATUS "RidgeFill: cuBLAS from ${RIDGEFILL_CUBLAS_ROOT}")
endif()

# Without the driver library (a build machine with no GPU driver and no stubs),
# ggml-cuda cannot link CUDA::cuda_driver; build without VMM then, as upstream allows.
find_package(CUDAToolkit QUIET)
if(NOT TARGET CUDA::cuda_driver AND NOT GGML_CUDA_NO_VMM)
    set(GGML_CUDA_NO_VMM ON CACHE BOOL "ggml: do not use CUDA VMM (no libcuda at build time)" FORCE)
    message(STATUS "RidgeFill: no libcuda found, building ggml-cuda with GGML_CUDA_NO_VMM")
endif()
