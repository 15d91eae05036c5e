# Apache Arrow and Parquet C++ (verl's data files are parquet) from the pyarrow wheel that scripts/setup.sh
# installs into the project's .venv: the wheel ships the headers and libarrow.so.N / libparquet.so.N, so no
# Arrow package has to exist for Debian or be built from source. Included after torch.cmake, whose
# site-packages it looks in first; -DHF_PYARROW_DIR=<dir of the pyarrow package> overrides.
#
# Defines hf_arrow, an interface target with the headers (as system headers) and both libraries.
#
# ABI (checked against pyarrow 25.0.1, manylinux_2_28): the wheel is built with gcc-toolset 14 and the
# new std::string ABI (its exported symbols use std::__cxx11, e.g. arrow::Status::ToString[abi:cxx11]), the
# same as Debian 12's g++ 12 default (_GLIBCXX_USE_CXX11_ABI=1, which libtorch also needs), so strings and
# shared_ptrs cross the boundary as-is. gcc-toolset links its newer libstdc++ parts statically and leaves only
# GLIBCXX_3.4.22 / CXXABI_1.3.11 to the system's libstdc++ (Debian 12 has 3.4.30). Its headers compile with
# g++ 12 in C++20. The libraries are linked by full path to their versioned names (the wheel has no
# unversioned libarrow.so), and found at run time through the build RPATH, without Python or LD_LIBRARY_PATH.
# libparquet exports a bundled OpenSSL libcrypto (for parquet encryption); nothing else in hybridflow loads
# OpenSSL, so nothing else binds to it.

find_path(HF_PYARROW_DIR include/arrow/api.h
          HINTS "${HF_TORCH_ROOT}/../pyarrow" ENV HF_PYARROW_DIR
          NO_DEFAULT_PATH)
if(NOT HF_PYARROW_DIR)
  message(FATAL_ERROR "Arrow C++ not found: hybridflow reads parquet data through the pyarrow wheel's libraries. "
                      "Run scripts/setup.sh (it installs pyarrow into .venv), or pass -DHF_PYARROW_DIR=$(python -c "
                      "'import os, pyarrow; print(os.path.dirname(pyarrow.__file__))')")
endif()
file(STRINGS "${HF_PYARROW_DIR}/include/arrow/util/config.h" _hf_arrow_so REGEX "#define ARROW_SO_VERSION \"[0-9]+\"")
string(REGEX REPLACE ".*\"([0-9]+)\".*" "\\1" HF_ARROW_SO_VERSION "${_hf_arrow_so}")
file(STRINGS "${HF_PYARROW_DIR}/include/arrow/util/config.h" _hf_arrow_version REGEX "#define ARROW_VERSION_STRING")
string(REGEX REPLACE ".*\"(.*)\".*" "\\1" HF_ARROW_VERSION "${_hf_arrow_version}")
foreach(lib arrow parquet)
  find_library(HF_LIB_${lib} NAMES lib${lib}.so.${HF_ARROW_SO_VERSION} PATHS "${HF_PYARROW_DIR}" NO_DEFAULT_PATH)
  if(NOT HF_LIB_${lib})
    message(FATAL_ERROR "lib${lib}.so.${HF_ARROW_SO_VERSION} not found in ${HF_PYARROW_DIR} (the headers say Arrow "
                        "${HF_ARROW_VERSION}); reinstall pyarrow with scripts/setup.sh")
  endif()
endforeach()
message(STATUS "hybridflow: Arrow ${HF_ARROW_VERSION} at ${HF_PYARROW_DIR}")

add_library(hf_arrow INTERFACE)
target_include_directories(hf_arrow SYSTEM INTERFACE "${HF_PYARROW_DIR}/include")
target_link_libraries(hf_arrow INTERFACE ${HF_LIB_parquet} ${HF_LIB_arrow})
list(APPEND CMAKE_BUILD_RPATH "${HF_PYARROW_DIR}")
