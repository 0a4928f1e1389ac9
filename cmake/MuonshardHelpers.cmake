# Small wrappers so every target gets the same warnings and include roots.
set(MUONSHARD_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
if(MUONSHARD_WERROR)
  list(APPEND MUONSHARD_WARNINGS -Werror)
endif()

function(muonshard_apply_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${MUONSHARD_WARNINGS}>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/proto)
endfunction()

# muonshard_cc_library(NAME SRCS ... DEPS ...)
function(muonshard_cc_library name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SRCS})
  muonshard_apply_defaults(${name})
  target_link_libraries(${name} PUBLIC ${A_DEPS})
endfunction()

# muonshard_cc_binary(NAME SRCS ... DEPS ...)
function(muonshard_cc_binary name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${A_SRCS})
  muonshard_apply_defaults(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS})
endfunction()

# muonshard_cc_test(NAME SRCS ... DEPS ... [LABELS ...] [TIMEOUT s])
# Registers each gtest case with ctest (gtest_discover_tests) so failures name the case.
function(muonshard_cc_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SRCS})
  muonshard_apply_defaults(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gmock GTest::gtest_main)
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(labels ${A_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    # One variable only: gtest_discover_tests splits list values, so the
    # source dir is the working directory instead.
    PROPERTIES LABELS "${labels}" TIMEOUT ${A_TIMEOUT}
               ENVIRONMENT "MUONSHARD_BIN_DIR=${PROJECT_BINARY_DIR}/bin"
    DISCOVERY_TIMEOUT 60)
endfunction()
