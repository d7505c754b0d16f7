#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the build, then checks what a user finds there: the layout (nothing that clashes
# with a real NCCL or nccl-tests in the same prefix), programs built against it the ways users
# build them (CMake's find_package(chorus), shared and static, from a C-only project; pkg-config,
# shared and --static), the installed perf tool, and the installed drop-in libnccl.so.2.
#   install_test.sh BUILD_DIR SOURCE_DIR          cmake --install into a scratch prefix
#   install_test.sh --deb BUILD_DIR SOURCE_DIR    cpack's Debian packages, installed for real
#         (apt-get install ./*.deb: dpkg, the declared Depends resolved from the archive, then
#         purged) when run as root on a machine that has no libchorus0 yet; otherwise (or with
#         CHORUS_TEST_DEB_UNPACK=1) unpacked into a scratch root (dpkg -x)
set -euo pipefail
mode=install
if [ "${1:-}" = --deb ]; then
  mode=deb
  shift
fi
build=$(readlink -f "$1")
src=$(readlink -f "$2")
scratch=$(mktemp -d /tmp/chorus-install-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

if [ $mode = install ]; then
  prefix=$scratch/prefix
  cmake --install "$build" --prefix "$prefix" > /dev/null
else
  (cd "$build" && cpack -G DEB -B "$scratch/packages" > "$scratch/cpack.log") ||
    { cat "$scratch/cpack.log"; exit 1; }
  debs=()
  for name in libchorus0 libchorus-dev chorus-tools; do
    deb=$(find "$scratch/packages" -maxdepth 1 -name "${name}_*.deb" | head -1)
    [ -n "$deb" ] || { echo "FAIL: cpack made no $name package"; ls "$scratch/packages"; exit 1; }
    echo "$(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"
    debs+=("$deb")
  done
  if [ "$(id -u)" -eq 0 ] && [ -z "${CHORUS_TEST_DEB_UNPACK:-}" ] && command -v apt-get > /dev/null &&
    ! dpkg-query -W -f '${Status}' libchorus0 2> /dev/null | grep -q installed; then
    # Installed as a user would: dpkg runs the packages' scripts and triggers (ldconfig), apt
    # resolves their Depends from the archive. Purged again on exit, whatever happens.
    trap 'apt-get purge -y -q libchorus0 libchorus-dev chorus-tools > /dev/null 2>&1; rm -rf "$scratch"' EXIT
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${debs[@]}" \
      > "$scratch/apt.log" 2>&1 || { cat "$scratch/apt.log"; echo "FAIL: apt-get install of the packages"; exit 1; }
    dpkg -L libchorus0 | grep -q 'libchorus\.so\.0$' || { echo "FAIL: dpkg -L libchorus0"; exit 1; }
    echo "installed with apt-get (purged on exit)"
    prefix=/usr
  else
    # Unpacked as dpkg would install them, without touching this machine's /usr.
    for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$scratch/root"; done
    echo "unpacked with dpkg -x (not root, libchorus0 already installed, or CHORUS_TEST_DEB_UNPACK)"
    prefix=$scratch/root/usr
  fi
fi

fail() {
  echo "FAIL: $*"
  exit 1
}
# What was installed: the packages' files, or everything under the scratch prefix.
if [ "$prefix" = /usr ]; then
  files=$(dpkg -L libchorus0 libchorus-dev chorus-tools)
else
  files=$(find "$prefix")
fi
lib=$(grep '/libchorus\.so\.0$' <<< "$files" | head -1)
[ -n "$lib" ] || fail "no libchorus.so.0 under $prefix"
libdir=$(dirname "$lib")
test -f "$prefix/include/chorus/nccl/nccl.h" || fail "no include/chorus/nccl/nccl.h"
test -f "$prefix/include/chorus/stream.h" || fail "no include/chorus/stream.h"
! grep -qx "$prefix/include/nccl.h" <<< "$files" || fail "include/nccl.h would clash with a real NCCL's"
test -x "$prefix/libexec/chorus/all_reduce_perf" || fail "no libexec/chorus/all_reduce_perf"
! grep -q "^$prefix/bin/.*_perf$" <<< "$files" || fail "perf tools in bin/ clash with nccl-tests"
! grep -qx "$libdir/libnccl.so.2" <<< "$files" || fail "libnccl.so.2 in the library directory shadows NCCL"
dropin=$libdir/chorus/libnccl.so.2
test -e "$dropin" || fail "no drop-in $dropin"
test -x "$prefix/bin/chorus-run" || fail "no bin/chorus-run"

# find_package from a project that enables C only: the static library must bring the C++
# runtime itself.
cmake -S "$src/tests/install/consumer" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$scratch/build" > /dev/null
LD_LIBRARY_PATH="$libdir" "$scratch/build/consumer_shared"
"$scratch/build/consumer_static"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$src/tests/install/consumer/consumer.c" -o "$scratch/consumer_pc" \
  $(pkg-config --cflags --libs chorus)
LD_LIBRARY_PATH="$libdir" "$scratch/consumer_pc"
# Installed into the system, the dynamic loader finds it with no help (dpkg's ldconfig trigger).
if [ "$prefix" = /usr ]; then
  env -u LD_LIBRARY_PATH "$scratch/consumer_pc" || fail "consumer without LD_LIBRARY_PATH"
fi
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$src/tests/install/consumer/consumer.c" -o "$scratch/consumer_pc_static" \
  $(pkg-config --cflags chorus) -L"$libdir" -Wl,-Bstatic -lchorus -Wl,-Bdynamic \
  $(pkg-config --static --libs-only-other --libs-only-l chorus | sed 's/-lchorus//')
"$scratch/consumer_pc_static"

# The installed perf tool finds the installed library by itself (its RUNPATH).
"$prefix/libexec/chorus/all_reduce_perf" -b 8 -e 64K -f 8 -t 2 -n 2 -w 1 > "$scratch/perf.out" ||
  { cat "$scratch/perf.out"; fail "installed all_reduce_perf"; }
grep -q "Out of bounds values : 0 OK" "$scratch/perf.out" || { cat "$scratch/perf.out"; fail "perf"; }

# The installed drop-in: a program that links -lnccl from it (as against NCCL) runs on Chorus.
cc -std=c11 -Wall -Werror -I"$prefix/include/chorus/nccl" "$src/tests/install/consumer/nccl_only.c" \
  -o "$scratch/nccl_only" -L"$libdir/chorus" -lnccl
LD_LIBRARY_PATH="$libdir/chorus" "$scratch/nccl_only"
readelf -dW "$scratch/nccl_only" | grep -q 'NEEDED.*\[libnccl.so.2\]' || fail "not linked to libnccl.so.2"
echo "install test ($mode, prefix $prefix): layout, find_package (shared, static, C only), pkg-config (shared," \
  "static), installed all_reduce_perf and drop-in libnccl.so.2 consumers ran"
