#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The library loads with dlopen() in a process that did not link it (Python's ctypes, a
# framework's plug-in, LD_PRELOAD of the drop-in): its thread-local storage must fit the few
# hundred bytes glibc keeps for such libraries, or dlopen fails with "cannot allocate memory in
# static TLS block".
#   dlopen_test.sh path/to/libchorus.so
set -euo pipefail
lib=$1
tls=$(readelf -lW "$lib" | awk '$1 == "TLS" { print $6 }')
tls=$((${tls:-0}))
echo "thread-local storage: ${tls:-0} bytes"
if [ "${tls:-0}" -gt 256 ]; then
  echo "FAIL: more than 256 bytes of thread-local storage (glibc's dlopen reserve is 512 bytes)"
  exit 1
fi
python3 - "$lib" << 'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
version = ctypes.c_int()
assert lib.chorusGetVersion(ctypes.byref(version)) == 0
print(f"dlopen {sys.argv[1]}: chorusGetVersion {version.value}")
PY
