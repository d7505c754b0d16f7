# SPDX-License-Identifier: Apache-2.0
# CHORUS_SANITIZE="address;undefined" or "thread": instruments everything built here.
# CHORUS_BUILD_FUZZERS (clang): also coverage instrumentation for libFuzzer (the library but its
# kernels, and the fuzz targets), and address;undefined unless CHORUS_SANITIZE names others.
# scripts/sanitizers.sh builds and runs these configurations; tests/sanitizers/ holds the
# suppression files, each entry explained.
if(CHORUS_BUILD_FUZZERS AND NOT CHORUS_SANITIZE)
  set(CHORUS_SANITIZE "address;undefined")
endif()
if(CHORUS_SANITIZE)
  list(JOIN CHORUS_SANITIZE "," _chorus_san)
  message(STATUS "chorus: sanitizers ${_chorus_san}")
  add_compile_options(-fsanitize=${_chorus_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_chorus_san})
  # gcc: "atomic_thread_fence is not supported with -fsanitize=thread" (-Wtsan). TSan does not
  # model fences; Chorus's (seq_cst, in the doorbell/idler Dekker pairs of core/process.cc and
  # core/engine.cc) order atomic accesses only, which TSan never reports as races.
  if("thread" IN_LIST CHORUS_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-tsan)
  endif()
endif()
if(CHORUS_BUILD_FUZZERS)
  # Coverage for libFuzzer where inputs are parsed: every layer of the library but the kernels
  # (chorus_layer adds it), and the fuzz targets. Not the kernels' loops, nor the tests: the
  # ASan stage runs the test suite in this same build, and counters and comparison hooks in
  # every reduction loop and every reference check only slow it down.
  set(CHORUS_FUZZ_COVERAGE -fsanitize=fuzzer-no-link)
  # clang 14: coverage plus UBSan's "function" check on coroutines fails to assemble ("Cannot
  # represent a difference across sections"). That check (calls through a function pointer of
  # the wrong type) is the one left out; it must follow -fsanitize=undefined.
  if("undefined" IN_LIST CHORUS_SANITIZE)
    add_compile_options(-fno-sanitize=function)
  endif()
endif()
