# libtorch from a PyTorch install, found through CMAKE_PREFIX_PATH = torch.utils.cmake_prefix_path
# (scripts/build.sh passes the project's virtual environment's).
#
# Defines hf_torch, the one target every hybridflow target links for libtorch:
#  - HF_CUDA=OFF (default): libtorch_cpu + c10 only, set up here without find_package(Torch), because the
#    PyPI wheel is CUDA-enabled and its TorchConfig insists on a CUDA toolkit that a CPU user does not need.
#    The binaries then never load libtorch_cuda (about 1.5 GB of code) and run anywhere.
#  - HF_CUDA=ON: find_package(Torch) with the machine's nvcc, the CUDA language enabled, and libtorch_cuda
#    linked, so the CUDA allocator, streams and ProcessGroupNCCL are there. HF_WITH_CUDA is defined.
#
# Both configurations compile the same sources: device-specific code asks libtorch at run time
# (torch::cuda::is_available) and only the NCCL construction is behind HF_WITH_CUDA.

find_path(HF_TORCH_CMAKE_DIR TorchConfig.cmake HINTS ${CMAKE_PREFIX_PATH} ENV Torch_DIR PATH_SUFFIXES Torch
          NO_DEFAULT_PATH)
if(NOT HF_TORCH_CMAKE_DIR)
  message(FATAL_ERROR "libtorch not found: pass -DCMAKE_PREFIX_PATH=$(python -c 'import torch; print(torch.utils.cmake_prefix_path)') "
                      "(scripts/build.sh does this with the project's .venv; scripts/setup.sh installs it)")
endif()
get_filename_component(HF_TORCH_ROOT "${HF_TORCH_CMAKE_DIR}/../../.." ABSOLUTE)
# The version header moved between releases (torch/version.h before 2.9, torch/headeronly/version.h after).
file(GLOB_RECURSE _hf_version_headers "${HF_TORCH_ROOT}/include/torch/*version.h")
set(HF_TORCH_VERSION "")
foreach(_hf_header ${_hf_version_headers})
  file(STRINGS "${_hf_header}" _hf_lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR) [0-9]+")
  if(_hf_lines)
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*" "\\1.\\2" HF_TORCH_VERSION "${_hf_lines}")
    break()
  endif()
endforeach()
if(HF_TORCH_VERSION VERSION_LESS 2.5)
  message(FATAL_ERROR "libtorch ${HF_TORCH_VERSION} at ${HF_TORCH_ROOT} is too old: hybridflow needs 2.5 or newer "
                      "(scaled_dot_product_attention with grouped-query heads, Gloo reduce_scatter)")
endif()
message(STATUS "hybridflow: libtorch ${HF_TORCH_VERSION} at ${HF_TORCH_ROOT} (CUDA build: ${HF_CUDA})")

add_library(hf_torch INTERFACE)
if(HF_CUDA)
  # Torch first: its CMake warns about (and drops) CMAKE_CUDA_ARCHITECTURES set before it; it compiles for
  # TORCH_CUDA_ARCH_LIST. Our own CUDA language then targets the same Ampere and Hopper parts.
  find_package(Torch REQUIRED)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  target_link_libraries(hf_torch INTERFACE torch)
  # The wheel's libtorch_cuda was linked against the CUDA libraries the wheel ships (NCCL, cuDNN, cuBLAS of
  # CUDA 13.2, under site-packages/nvidia); the toolkit's older copies (CUDA 13.0's NCCL lacks symbols it
  # needs) must not stand in for them, at link time nor at run time.
  file(GLOB HF_WHEEL_CUDA_LIB_DIRS LIST_DIRECTORIES true "${HF_TORCH_ROOT}/../nvidia/*/lib")
  foreach(dir ${HF_WHEEL_CUDA_LIB_DIRS})
    target_link_options(hf_torch INTERFACE "-Wl,-rpath-link,${dir}")
  endforeach()
  target_compile_definitions(hf_torch INTERFACE HF_WITH_CUDA=1)
else()
  foreach(lib torch_cpu c10)
    find_library(HF_LIB_${lib} ${lib} PATHS "${HF_TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
  endforeach()
  target_include_directories(hf_torch SYSTEM INTERFACE "${HF_TORCH_ROOT}/include"
                                                      "${HF_TORCH_ROOT}/include/torch/csrc/api/include")
  # What the torch_cpu target of TorchConfig would add: c10d with Gloo.
  target_compile_definitions(hf_torch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO)
  target_compile_features(hf_torch INTERFACE cxx_std_20)
  # --no-as-needed: libtorch_cpu registers operators in static initialisers; nothing may drop it.
  target_link_libraries(hf_torch INTERFACE "-Wl,--no-as-needed" ${HF_LIB_torch_cpu} ${HF_LIB_c10} "-Wl,--as-needed"
                                           Threads::Threads)
endif()
# libtorch's OpenMP runtime, for our own files compiled with -fopenmp (src/model/fused_decode.cpp): linking
# this copy, not the compiler's, keeps one OpenMP thread pool in the process (the wheel ships it as
# libgomp.so.1; a libtorch without one falls back to the compiler's).
find_library(HF_LIB_gomp NAMES libgomp.so.1 gomp PATHS "${HF_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
if(HF_LIB_gomp)
  target_link_libraries(hf_torch INTERFACE ${HF_LIB_gomp})
else()
  target_link_options(hf_torch INTERFACE -fopenmp)  # the runtime only: no other file is compiled with OpenMP
endif()
# Binaries find libtorch (and the CUDA libraries the wheel ships beside it) without LD_LIBRARY_PATH.
set(CMAKE_BUILD_RPATH "${HF_TORCH_ROOT}/lib" ${HF_WHEEL_CUDA_LIB_DIRS})
