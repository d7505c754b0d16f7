#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages Chorus needs. Idempotent: packages already present are not
# touched and apt is not called at all when nothing is missing.
#
#   scripts/install-deps.sh            build + test dependencies (the accuracy test's python
#                                      packages included), and the soft-RoCE guest's
#                                      (the rdma stage: scripts/rxe-guest.sh, tests/rdma/)
#   scripts/install-deps.sh --bench    also the peers measured by bench/ (Open MPI, PyTorch/Gloo, plots)
set -euo pipefail

build_pkgs=(build-essential cmake pkg-config git libfmt-dev libhwloc-dev hwloc-nox catch2
            libbenchmark-dev libssl-dev libibverbs-dev librdmacm-dev rdma-core ibverbs-utils
            libucx-dev ucx-utils openmpi-bin libopenmpi-dev clang libclang-rt-14-dev llvm binutils
            iproute2 procps iperf3 libopenblas-dev)
# iperf3: background traffic on a test bed link (scripts/testbed.sh traffic; without it a
# python3 sender stands in).
# The soft-RoCE guest boots Debian's kernel (downloaded by scripts/rxe-guest.sh, not installed)
# in QEMU with a static busybox as its init; the rdma tests use perftest's and rdma-core's tools.
rdma_pkgs=(qemu-system-x86 busybox-static xz-utils perftest rdmacm-utils)
# The FP8 accuracy test (tests/accuracy/, label accuracy) runs Debian's /usr/bin/python3 with
# numpy, matplotlib (the plot) and sklearn (only for its digits data set, digits.csv.gz).
# The launcher tests start ranks with torchrun (python3-torch) and a real single-machine Slurm
# (slurm-wlm, munge; tests/launcher/). The torch.distributed backend (bindings/torch) builds
# against libtorch-dev and pybind11-dev.
test_pkgs=(python3-numpy python3-matplotlib python3-sklearn python3-torch slurm-wlm munge
           libtorch-dev pybind11-dev)
bench_pkgs=(python3-torch python3-numpy gnuplot-nox python3-matplotlib)

want=("${build_pkgs[@]}" "${test_pkgs[@]}" "${rdma_pkgs[@]}")
for arg in "$@"; do
  case "$arg" in
    --bench) want+=("${bench_pkgs[@]}") ;;
    *) echo "install-deps.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all ${#want[@]} packages present"
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
