# SPDX-License-Identifier: Apache-2.0
# Headers, libraries, the CMake package (find_package(chorus)) and pkg-config file.
include(CMakePackageConfigHelpers)
install(FILES ${PROJECT_SOURCE_DIR}/include/nccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/chorus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS chorus chorus_static EXPORT chorusTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT chorusTargets NAMESPACE chorus:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/chorus)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/chorusConfig.cmake.in
  ${PROJECT_BINARY_DIR}/chorusConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/chorus)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/chorusConfig.cmake ${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/chorus)
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
install(FILES ${PROJECT_BINARY_DIR}/chorus.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
