# hf_layer(<name> [NO_TORCH] DEPS ...): a library hf_<name> from src/<name>/*.cpp, static unless
# HF_SHARED_LAYERS is on (then shared: ~100 test executables stay small enough to copy to a GPU machine).
# A layer with no sources yet is an INTERFACE library, so the layer graph is declared up front
# and a new file needs no CMake edit. A NO_TORCH layer (plain C++, e.g. text processing) skips the
# libtorch precompiled header, and so do its tests: its files compile in a second instead of ten.
function(hf_layer name)
  cmake_parse_arguments(ARG "NO_TORCH" "" "DEPS" ${ARGN})
  if(ARG_NO_TORCH)
    set_property(GLOBAL APPEND PROPERTY HF_NO_TORCH_LAYERS ${name})
  endif()
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${name}/*.cpp)
  if(srcs)
    if(HF_SHARED_LAYERS)
      add_library(hf_${name} SHARED ${srcs})
    else()
      add_library(hf_${name} STATIC ${srcs})
    endif()
    target_include_directories(hf_${name} PUBLIC ${CMAKE_SOURCE_DIR}/include PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(hf_${name} PUBLIC ${ARG_DEPS})
    target_compile_options(hf_${name} PRIVATE ${HF_WARNINGS})
    if(HF_UNITY)
      # Each libtorch translation unit costs seconds of template instantiation even with the precompiled
      # header; batching a layer's files divides that (a cold build is the first thing a new user waits for).
      # Files of one layer therefore must not define the same name in an anonymous namespace.
      set_target_properties(hf_${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${HF_UNITY_BATCH})
      # GCC warns about a class whose members use an anonymous-namespace type when the class is defined in an
      # included file, taking it for a header; in a unity build every source file is an included file.
      target_compile_options(hf_${name} PRIVATE -Wno-subobject-linkage)
    endif()
    if(NOT ARG_NO_TORCH)
      target_precompile_headers(hf_${name} REUSE_FROM hf_pch)
    endif()
  else()
    add_library(hf_${name} INTERFACE)
    target_include_directories(hf_${name} INTERFACE ${CMAKE_SOURCE_DIR}/include)
    target_link_libraries(hf_${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

# One executable per tests/<layer>/test_*.cpp, linked to its layer; each is one CTest test.
function(hf_layer_tests)
  get_property(no_torch_layers GLOBAL PROPERTY HF_NO_TORCH_LAYERS)
  foreach(layer ${ARGN})
    file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${layer}/test_*.cpp)
    foreach(src ${srcs})
      get_filename_component(name ${src} NAME_WE)
      add_executable(${name} ${src})
      target_link_libraries(${name} PRIVATE hf_${layer} GTest::gtest_main GTest::gmock)
      target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/src)
      target_compile_options(${name} PRIVATE ${HF_WARNINGS})
      target_compile_definitions(${name} PRIVATE HF_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
      if(NOT layer IN_LIST no_torch_layers)
        target_precompile_headers(${name} REUSE_FROM hf_pch)
      endif()
      add_test(NAME ${layer}.${name} COMMAND ${name})
      set_tests_properties(${layer}.${name} PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_WAIT_POLICY=passive")
    endforeach()
  endforeach()
endfunction()
