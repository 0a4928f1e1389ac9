# Sanitizer and fuzzing builds (docs/hardening.md). Both instrument every
# target of the project, so they are set before any add_subdirectory.
#
#   MUONSHARD_SANITIZE=address  ASan + UBSan (gcc or clang): every error
#                               aborts (-fno-sanitize-recover), frames kept.
#   MUONSHARD_SANITIZE=thread   TSan. Debian's abseil is not instrumented, so
#                               absl::Mutex is invisible to TSan unless the
#                               tests run on an instrumented abseil
#                               (scripts/sanitize.sh tsan builds one).
#   MUONSHARD_FUZZ=ON           libFuzzer targets in fuzz/ (clang only); the
#                               project is built with -fsanitize=fuzzer-no-link
#                               plus ASan + UBSan, the targets link libFuzzer.
#
# Scripts: scripts/sanitize.sh (build-asan, build-tsan) and scripts/fuzz.sh
# (build-fuzz). None of them is the default build.
set(MUONSHARD_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan+UBSan), thread (TSan) or empty")
set_property(CACHE MUONSHARD_SANITIZE PROPERTY STRINGS "" address thread)
option(MUONSHARD_FUZZ "Build the libFuzzer targets in fuzz/ (clang; implies ASan+UBSan)" OFF)

set(MUONSHARD_SANITIZER_FLAGS "")
if(MUONSHARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MUONSHARD_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang (scripts/fuzz.sh does)")
  endif()
  if(MUONSHARD_SANITIZE STREQUAL "thread")
    message(FATAL_ERROR "MUONSHARD_FUZZ runs under ASan+UBSan, not with MUONSHARD_SANITIZE=thread")
  endif()
  set(MUONSHARD_SANITIZER_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                                -fno-omit-frame-pointer)
elseif(MUONSHARD_SANITIZE STREQUAL "address")
  set(MUONSHARD_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
                                -fno-omit-frame-pointer)
elseif(MUONSHARD_SANITIZE STREQUAL "thread")
  set(MUONSHARD_SANITIZER_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT MUONSHARD_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MUONSHARD_SANITIZE must be address, thread or empty, got \"${MUONSHARD_SANITIZE}\"")
endif()

if(MUONSHARD_SANITIZER_FLAGS)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${MUONSHARD_SANITIZER_FLAGS}>")
  # fuzzer-no-link is a compile-time flag only; the targets add -fsanitize=fuzzer.
  list(REMOVE_ITEM MUONSHARD_SANITIZER_FLAGS -fsanitize=fuzzer-no-link,address,undefined)
  if(MUONSHARD_FUZZ)
    list(APPEND MUONSHARD_SANITIZER_FLAGS -fsanitize=address,undefined)
  endif()
  add_link_options(${MUONSHARD_SANITIZER_FLAGS})
  message(STATUS "muonshard: sanitizer flags = ${MUONSHARD_SANITIZER_FLAGS} (fuzz = ${MUONSHARD_FUZZ})")
endif()
