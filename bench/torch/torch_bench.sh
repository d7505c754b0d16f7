#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# torch.distributed benchmark, Chorus CPU backend vs gloo in the same job (see torch_bench.py).
# Usage: bench/torch/torch_bench.sh <build-dir> [--quick] [--out-dir DIR] [--iters N] [other torch_bench.py options]
#   env NPROC=3 (ranks), CHORUS_TORCH_BACKEND_UNDER_TEST=gloo (benchmark gloo against itself, no Chorus needed)
# Results: table on stdout; torch_bench.csv + torch_bench.png in --out-dir (default bench/torch/results/).
# Launches `/usr/bin/python3 -m torch.distributed.run --redirects 9:1 --tee 9:1` (Debian torch lives in
# /usr/bin/python3; the flags dodge torchrun's Python 3.11 crash, pytorch#92319).
set -eu
BUILD=${1:?usage: $0 <build-dir> [torch_bench.py options]}
shift
BUILD=$(cd "$BUILD" 2>/dev/null && pwd || echo "$BUILD")
HERE=$(cd "$(dirname "$0")" && pwd)
NPROC=${NPROC:-3}
UT=${CHORUS_TORCH_BACKEND_UNDER_TEST:-chorus}
if [ "$UT" = chorus ] && [ ! -e "$BUILD/bindings/torch/chorus_torch" ]; then
    echo "error: $BUILD/bindings/torch/chorus_torch not found (build the chorus torch backend, or set" \
         "CHORUS_TORCH_BACKEND_UNDER_TEST=gloo)" >&2
    exit 2
fi
export PYTHONPATH="$BUILD/bindings/torch${PYTHONPATH:+:$PYTHONPATH}"
PORT=$(/usr/bin/python3 - $((20000 + ($$ * 13) % 30000)) <<'PYEOF'
import socket, sys
for p in range(int(sys.argv[1]), 65000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass
    finally:
        s.close()
PYEOF
)
exec /usr/bin/python3 -m torch.distributed.run --nproc_per_node "$NPROC" --redirects 9:1 --tee 9:1 \
    --master_addr 127.0.0.1 --master_port "$PORT" "$HERE/torch_bench.py" --backend-under-test "$UT" "$@"
