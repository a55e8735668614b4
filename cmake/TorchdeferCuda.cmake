# Note [CUDA counter fill build]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The CUDA counter fill (replay/src/cuda/) is compiled by nvcc whenever one is found:
#  * torch built with CUDA: the kernel's objects and its dispatch (replay/src/counter_rng_cuda.cpp)
#    go into the library, and TORCHDEFER_WITH_CUDA turns the CUDA path of counter_fill on;
#  * torch without CUDA (this repository's CI): the kernel is compiled into an object library
#    that nothing links, so a CUDA syntax or type error fails the normal build here too.
# No nvcc: a configure message says the check is skipped (with CUDA torch, an error). Turn it
# off with -DTORCHDEFER_CUDA=OFF. -fmad=false is part of the definition (Note [Counter RNG]):
# without it nvcc fuses multiply-adds and the bits differ from the CPU's.
option(TORCHDEFER_CUDA "Compile the CUDA counter fill with nvcc (linked when torch has CUDA)" ON)

macro(torchdefer_add_cuda_counter_fill)
  if(NOT TORCHDEFER_CUDA)
    message(STATUS "torchdefer: CUDA counter fill off (TORCHDEFER_CUDA=OFF)")
  else()
    if(NOT CMAKE_CUDA_COMPILER)
      file(GLOB _torchdefer_cuda_bins LIST_DIRECTORIES true /usr/local/cuda/bin /usr/local/cuda-*/bin)
      find_program(TORCHDEFER_NVCC nvcc HINTS ${_torchdefer_cuda_bins})
      if(TORCHDEFER_NVCC)
        set(CMAKE_CUDA_COMPILER "${TORCHDEFER_NVCC}")
      endif()
    endif()
    if(NOT CMAKE_CUDA_COMPILER)
      if(CAFFE2_USE_CUDA)
        message(FATAL_ERROR "torchdefer: torch has CUDA but no nvcc was found for the CUDA counter "
                            "fill; set CMAKE_CUDA_COMPILER, or -DTORCHDEFER_CUDA=OFF.")
      endif()
      message(STATUS "torchdefer: no nvcc found: the CUDA counter fill is not compiled "
                     "(set CMAKE_CUDA_COMPILER to compile-check it)")
    else()
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 90)  # H100; one architecture keeps the compile short
      endif()
      set(CMAKE_CUDA_STANDARD 17)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      if(TORCHDEFER_CCACHE AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
        set(CMAKE_CUDA_COMPILER_LAUNCHER "${TORCHDEFER_CCACHE}")
      endif()
      enable_language(CUDA)
      add_library(torchdefer_cuda_counter_fill OBJECT
                  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/counter_fill.cu)
      target_compile_options(torchdefer_cuda_counter_fill PRIVATE -fmad=false)
      target_include_directories(torchdefer_cuda_counter_fill
                                 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/internal)
      set_target_properties(torchdefer_cuda_counter_fill PROPERTIES POSITION_INDEPENDENT_CODE ON)
      if(CAFFE2_USE_CUDA)
        target_sources(torchdefer_replay PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/counter_rng_cuda.cpp)
        target_compile_definitions(torchdefer_replay PRIVATE TORCHDEFER_WITH_CUDA)
        # LibTorch's CMake turns CMAKE_CUDA_ARCHITECTURES OFF and passes TORCH_CUDA_ARCH_LIST's
        # -gencode flags itself.
        message(STATUS "torchdefer: CUDA counter fill built into the library "
                       "(${CMAKE_CUDA_COMPILER}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
                       "TORCH_CUDA_ARCH_LIST ${TORCH_CUDA_ARCH_LIST})")
      else()
        message(STATUS "torchdefer: torch has no CUDA: the CUDA counter fill is compile-checked "
                       "only (${CMAKE_CUDA_COMPILER}, sm_${CMAKE_CUDA_ARCHITECTURES})")
      endif()
    endif()
  endif()
endmacro()
