# SPDX-License-Identifier: Apache-2.0
# Debian's packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt 9 REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)

# Optional fabrics: found -> compiled in (CHORUS_HAVE_VERBS / CHORUS_HAVE_UCX).
pkg_check_modules(IBVERBS IMPORTED_TARGET libibverbs)
pkg_check_modules(RDMACM IMPORTED_TARGET librdmacm)
pkg_check_modules(UCX IMPORTED_TARGET ucx)
option(CHORUS_ENABLE_VERBS "Build the verbs transport when libibverbs and librdmacm are found" ON)
set(CHORUS_HAVE_VERBS OFF)
if(IBVERBS_FOUND AND RDMACM_FOUND AND CHORUS_ENABLE_VERBS)
  set(CHORUS_HAVE_VERBS ON)
endif()
# UCX's memory hooks (libucm patches mmap/malloc when it loads) crash ThreadSanitizer's
# interceptors: the TSan stage builds without it (scripts/sanitizers.sh).
option(CHORUS_ENABLE_UCX "Build the UCX transport when libucx is found" ON)
set(CHORUS_HAVE_UCX OFF)
if(UCX_FOUND AND CHORUS_ENABLE_UCX)
  set(CHORUS_HAVE_UCX ON)
endif()
message(STATUS "chorus: verbs=${CHORUS_HAVE_VERBS} ucx=${CHORUS_HAVE_UCX}")

if(CHORUS_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
  include(Catch)
endif()
if(CHORUS_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
find_package(MPI COMPONENTS C QUIET)
