# SPDX-License-Identifier: Apache-2.0
# What an install lays out, and the Debian packages cpack makes of it.
#
# Nothing here may clash with a real NCCL or nccl-tests installed in the same prefix:
#   <includedir>/chorus/*.h, <includedir>/chorus/nccl/nccl.h   (Cflags: -I<includedir>/chorus/nccl)
#   <libdir>/libchorus.so.0, libchorus.a, pkgconfig/chorus.pc, cmake/chorus/
#   <libdir>/chorus/libnccl.so.2   the drop-in, used only when asked for (LD_LIBRARY_PATH, LD_PRELOAD)
#   <bindir>/chorus-run, chorus-info
#   <libexecdir>/chorus/*_perf     the nccl-tests clones, under nccl-tests' own names
include(CMakePackageConfigHelpers)
# Installing (and cpack, whose "preinstall" would otherwise build `all`) never rebuilds: the
# install test makes packages while other tests run the build's binaries.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY TRUE)
set(CHORUS_NCCL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/chorus/nccl)
set(CHORUS_DROPIN_LIBDIR ${CMAKE_INSTALL_LIBDIR}/chorus)
set(CHORUS_TOOLS_LIBEXECDIR ${CMAKE_INSTALL_LIBEXECDIR}/chorus)

install(FILES ${PROJECT_SOURCE_DIR}/include/nccl.h DESTINATION ${CHORUS_NCCL_INCLUDEDIR}
        COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/chorus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev)
install(TARGETS chorus chorus_static EXPORT chorusTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${CHORUS_NCCL_INCLUDEDIR})
install(TARGETS chorus_nccl
        LIBRARY DESTINATION ${CHORUS_DROPIN_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(EXPORT chorusTargets NAMESPACE chorus:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/chorus
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/chorusConfig.cmake.in
  ${PROJECT_BINARY_DIR}/chorusConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/chorus)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/chorusConfig.cmake ${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/chorus COMPONENT dev)
# The .pc file locates its prefix relative to itself, so an installed tree can be moved.
file(RELATIVE_PATH CHORUS_PC_TO_PREFIX "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
set(CHORUS_PC_TRANSPORT_LIBS "")
if(CHORUS_HAVE_UCX)
  string(JOIN " " CHORUS_PC_TRANSPORT_LIBS ${UCX_LDFLAGS})
endif()
if(CHORUS_HAVE_VERBS)
  string(JOIN " " CHORUS_PC_TRANSPORT_LIBS ${CHORUS_PC_TRANSPORT_LIBS} ${IBVERBS_LDFLAGS})
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/chorus.pc.in ${PROJECT_BINARY_DIR}/chorus.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/chorus.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)

# Debian packages: `cpack -G DEB` in the build directory (scripts/package.sh). Three of them,
# as Debian splits a library: the shared libraries (libchorus0), what building against them
# needs (libchorus-dev), and the launcher, chorus-info and the perf tools (chorus-tools).
# dpkg-shlibdeps derives the runtime dependencies from what the binaries link.
set(CPACK_PACKAGE_NAME chorus)
set(CPACK_PACKAGE_VENDOR "Chorus")
set(CPACK_PACKAGE_CONTACT "Chorus developers <chorus@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The tools link libchorus.so.0, which no installed package provides yet: dpkg-shlibdeps finds
# it in the build tree, and chorus-tools names its exact libchorus0 below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/src)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_STRIP_FILES ON)  # debug info stays in the build tree
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libchorus0)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libchorus-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# What find_package(chorus) and pkg-config --static look for (cmake/chorusConfig.cmake.in).
set(CHORUS_DEV_DEPENDS "libchorus0 (= ${PROJECT_VERSION}), libfmt-dev, libhwloc-dev, libssl-dev, pkg-config")
if(CHORUS_HAVE_UCX)
  string(APPEND CHORUS_DEV_DEPENDS ", libucx-dev")
endif()
if(CHORUS_HAVE_VERBS)
  string(APPEND CHORUS_DEV_DEPENDS ", libibverbs-dev")
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${CHORUS_DEV_DEPENDS}")
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME chorus-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libchorus0 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "Chorus: libchorus.so.0 and the drop-in libnccl.so.2 (in <libdir>/chorus)")
set(CPACK_COMPONENT_DEV_DESCRIPTION "Chorus: headers, static library, pkg-config and CMake files")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "Chorus: chorus-run, chorus-info and the nccl-tests clones")
include(CPack)
