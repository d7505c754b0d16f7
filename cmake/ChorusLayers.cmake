# SPDX-License-Identifier: Apache-2.0
# Layers as build targets. Every layer of libchorus is an OBJECT library whose include path
# holds only its own headers and those of the layers it links: the headers of a layer are
# staged (symlinked) under build/layers/<target>/, so an include that runs the wrong way (a
# transport including core, core including a concrete transport) fails to build.
#
#   chorus_layer(<target> HEADERS <include path>=<source path> ...
#                [SOURCES <file>...] [PUBLIC <dep>...] [PRIVATE <dep>...])
function(chorus_layer target)
  cmake_parse_arguments(L "" "" "HEADERS;SOURCES;PUBLIC;PRIVATE" ${ARGN})
  add_library(${target} OBJECT ${L_SOURCES})
  set(stage ${PROJECT_BINARY_DIR}/layers/${target})
  foreach(spec ${L_HEADERS})
    string(REPLACE "=" ";" pair "${spec}")
    list(GET pair 0 rel)
    list(GET pair 1 src)
    get_filename_component(parent ${stage}/${rel} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    if(NOT EXISTS ${stage}/${rel})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${src} ${stage}/${rel} SYMBOLIC)
    endif()
  endforeach()
  target_include_directories(${target} PUBLIC ${stage} ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(${target} PRIVATE -fvisibility=hidden -fvisibility-inlines-hidden)
  if(CHORUS_FUZZ_COVERAGE AND NOT target STREQUAL "chorus_kernels")
    target_compile_options(${target} PRIVATE ${CHORUS_FUZZ_COVERAGE})  # ChorusSanitizers.cmake
  endif()
  target_compile_definitions(${target} PRIVATE $<$<BOOL:${CHORUS_ENABLE_TRACE}>:CHORUS_ENABLE_TRACE>)
  target_link_libraries(${target} PUBLIC ${L_PUBLIC} PRIVATE chorus_warnings ${L_PRIVATE})
  set_property(GLOBAL APPEND PROPERTY CHORUS_LAYERS ${target})
endfunction()

# A transport plug-in: transports/<name>/ holds its sources and a CMakeLists.txt calling
#   chorus_add_transport(<name> [PRIVATE <dep>...] [LIBS <link dependency>...])
# which builds it as a layer that sees only the transport interface (transports/transport.h,
# transports/registry.h) and the base layer, and registers it: the generated
# transports/builtin.cc calls chorus::<name>::register_transport() once.
function(chorus_add_transport name)
  cmake_parse_arguments(T "" "" "PRIVATE;LIBS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  list(FILTER sources EXCLUDE REGEX "_test\\.cc$|_bench\\.cc$")
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  chorus_layer(chorus_transport_${name} SOURCES ${sources}
               HEADERS transports/${name}=${rel}
               PUBLIC chorus_transport PRIVATE ${T_PRIVATE} ${T_LIBS})
  set_property(GLOBAL APPEND PROPERTY CHORUS_TRANSPORTS ${name})
  # Libraries the transport's objects need at link time (e.g. PkgConfig::UCX).
  set_property(GLOBAL APPEND PROPERTY CHORUS_TRANSPORT_LIBS ${T_LIBS})
endfunction()
