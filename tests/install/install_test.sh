#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the build into a scratch prefix, then builds programs against it the two ways users
# do: CMake's find_package(chorus) (shared and static) and pkg-config.
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
prefix=$(mktemp -d /tmp/chorus-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
test -f "$prefix/include/nccl.h"
test -f "$prefix/include/chorus/stream.h"
libdir=$(dirname "$(find "$prefix" -name 'libchorus.so' | head -1)")

cmake -S "$src/tests/install/consumer" -B "$prefix/build" -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$prefix/build" > /dev/null
LD_LIBRARY_PATH="$libdir" "$prefix/build/consumer_shared"
"$prefix/build/consumer_static"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$src/tests/install/consumer/consumer.c" -o "$prefix/consumer_pc" \
  $(pkg-config --cflags --libs chorus)
LD_LIBRARY_PATH="$libdir" "$prefix/consumer_pc"
echo "install test: find_package (shared, static) and pkg-config consumers ran"
