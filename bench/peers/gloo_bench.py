#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# File: bench/peers/gloo_bench.py
"""The Gloo peer of bench/coll/*_perf for bench/compare/compare.py.

Measures torch.distributed collectives with backend "gloo" on CPU float32 tensors the way
nccl-tests (and Chorus's tools) measure, with nccl-tests' size, count, algbw and busbw.
Run it with Debian's /usr/bin/python3 (PyTorch 1.13), once per rank, from a launcher that sets
RANK and WORLD_SIZE (chorus-run does, as do torchrun and mpirun with OMPI_COMM_WORLD_*), with
MASTER_ADDR and MASTER_PORT in the environment:

  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=lo \\
    chorus-run -n 2 /usr/bin/python3 bench/peers/gloo_bench.py -b 8 -e 128M -f 2 -J gloo.json

Collectives (-o): allreduce (dist.all_reduce), reduce_scatter (dist.reduce_scatter_tensor or
dist.reduce_scatter; Gloo in torch 1.13 supports neither, and the row set is then reported as
unsupported), allgather (dist.all_gather_into_tensor, else dist.all_gather into views of one
output tensor), alltoall (dist.all_to_all_single), bcast (dist.broadcast). torch's all_reduce and
broadcast work in place, so those two are timed in place on the receive slice (no copy added:
Gloo as PyTorch users call it); the others are out of place.

Per collective: -w warm-up calls at the largest and at the smallest size; per size one untimed
call, a barrier, -n timed calls (time.perf_counter from the first call to the
return of the last; Gloo calls are synchronous), time per call = elapsed / -n per rank, combined
over ranks as nccl-tests' default -a 1 (the mean); the maximum over ranks is reported too.
Successive timed calls use successive slices of -e-byte buffers, as nccl-tests does.
Formulas (n ranks, t seconds, GB = 1e9 B; size = the larger of one rank's send and receive
bytes, a size that gives some rank no element is skipped):
  allreduce  count = size/4     algbw = count*4/t    busbw = algbw*2(n-1)/n
  reduce_scatter, allgather, alltoall: count = size/(4n), algbw = count*4*n/t,
             busbw = algbw*(n-1)/n
  bcast      count = size/4     algbw = count*4/t    busbw = algbw
-c N checks N calls after timing (small integer inputs: exact float sums).
Exit status: 0 on success, 1 on a failed call or wrong result, 2 on a usage error.
"""

import argparse
import datetime
import json
import os
import re
import socket
import sys
import time

COLLS = ["allreduce", "reduce_scatter", "allgather", "alltoall", "bcast"]
FACTOR = {"allreduce": lambda n: 2.0 * (n - 1) / n, "bcast": lambda n: 1.0}


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KkMmGg]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size '{text}'")
    mul = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(m.group(1)) * mul


def parse_colls(text):
    out = []
    for c in text.split(","):
        if c == "all":
            out.extend(COLLS)
        elif c in COLLS:
            out.append(c)
        else:
            raise argparse.ArgumentTypeError(f"unknown collective '{c}'")
    return [c for c in COLLS if c in out]


def layout(coll, size, n):
    """(count, send_elems, recv_elems), or None when some rank would get no element."""
    elems = size // 4
    if coll in ("allreduce", "bcast"):
        count, send, recv = elems, elems, elems
    elif coll == "reduce_scatter":
        count = elems // n
        send, recv = count * n, count
    elif coll == "allgather":
        count = elems // n
        send, recv = count, count * n
    else:  # alltoall, count per peer
        count = elems // n
        send = recv = count * n
    return (count, send, recv) if count > 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--minbytes", type=parse_size, default=8)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=128 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", type=int, default=1)
    ap.add_argument("-c", "--check", type=int, default=1)
    ap.add_argument("-r", "--root", type=int, default=0)
    ap.add_argument("-o", "--colls", type=parse_colls, default=list(COLLS))
    ap.add_argument("-J", "--output_file", default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="Gloo operation timeout, s")
    args = ap.parse_args()
    if args.minbytes < 1 or args.minbytes > args.maxbytes or args.stepfactor < 2 or args.iters < 1:
        ap.error("need 1 <= -b <= -e, -f >= 2 and -n >= 1")

    env = os.environ
    rank = int(env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "-1")))
    world = int(env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "-1")))
    if rank < 0 or world < 1 or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        print("gloo_bench.py: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (or start it "
              "with chorus-run/torchrun)", file=sys.stderr)
        return 2
    if args.root >= world:
        ap.error("root is not a rank")

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the host's cores; Gloo itself does the work
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    n = world
    buf_elems = (args.maxbytes + 3) // 4
    send_buf = torch.zeros(buf_elems, dtype=torch.float32)
    recv_buf = torch.zeros(buf_elems, dtype=torch.float32)

    def combine(mine):
        t = torch.tensor([mine, mine], dtype=torch.float64)
        dist.all_reduce(t[0:1], op=dist.ReduceOp.SUM)
        dist.all_reduce(t[1:2], op=dist.ReduceOp.MAX)
        return float(t[0]) / n, float(t[1])

    apis = {}

    def make_call(coll):
        """Returns call(send, recv, count) for the collective, or raises if unsupported."""
        if coll == "allreduce":
            apis[coll] = "all_reduce"

            def call(s, r, count):
                dist.all_reduce(r, op=dist.ReduceOp.SUM)  # torch's API is in place
        elif coll == "reduce_scatter":
            if hasattr(dist, "reduce_scatter_tensor"):
                apis[coll] = "reduce_scatter_tensor"

                def call(s, r, count):
                    dist.reduce_scatter_tensor(r, s, op=dist.ReduceOp.SUM)
            else:
                apis[coll] = "reduce_scatter"

                def call(s, r, count):
                    dist.reduce_scatter(r, list(s.split(count)), op=dist.ReduceOp.SUM)
        elif coll == "allgather":
            apis[coll] = "all_gather_into_tensor"

            def call(s, r, count):
                dist.all_gather_into_tensor(r, s)
        elif coll == "alltoall":
            apis[coll] = "all_to_all_single"

            def call(s, r, count):
                dist.all_to_all_single(r, s)
        else:
            apis[coll] = "broadcast"

            def call(s, r, count):
                dist.broadcast(r, src=args.root)  # torch's API is in place
        return call

    def fallback(coll):
        if coll == "allgather":
            apis[coll] = "all_gather (list of views of one output tensor)"

            def call(s, r, count):
                dist.all_gather(list(r.split(count)), s)
            return call
        if coll == "reduce_scatter" and apis[coll] != "reduce_scatter":
            apis[coll] = "reduce_scatter"

            def call(s, r, count):
                dist.reduce_scatter(r, list(s.split(count)), op=dist.ReduceOp.SUM)
            return call
        return None

    def slices(send_elems, recv_elems, iteration):
        total = max(send_elems, recv_elems)
        slots = max(buf_elems // total, 1)
        off = total * (iteration % slots)
        return send_buf[off:off + send_elems], recv_buf[off:off + recv_elems]

    def expected_input(r, idx):
        return ((idx % 13 + r * 7) % 16).to(torch.float32)

    def arange(k):
        return torch.arange(k, dtype=torch.int32)

    def check_once(call, coll, count, se, re_):
        s, r = send_buf[:se], recv_buf[:re_]
        s.copy_(expected_input(rank, arange(se)))
        r.fill_(-1.0)
        if coll in ("allreduce", "bcast"):
            r.copy_(s)  # in-place APIs: the input is the receive slice
        call(s, r, count)
        idx = arange(re_)
        if coll == "allreduce":
            want = sum(expected_input(q, idx) for q in range(n))
        elif coll == "reduce_scatter":
            want = sum(expected_input(q, rank * count + idx) for q in range(n))
        elif coll == "allgather":
            want = torch.cat([expected_input(q, arange(count)) for q in range(n)])
        elif coll == "alltoall":
            want = torch.cat([expected_input(q, rank * count + arange(count)) for q in range(n)])
        else:
            want = expected_input(args.root, idx)
        return int((r != want).sum())

    sizes = []
    size = args.minbytes
    while size <= args.maxbytes:
        sizes.append(size)
        size *= args.stepfactor

    results, unsupported, failed = [], {}, False
    if rank == 0:
        print(f"# gloo_bench.py: torch {torch.__version__}, backend gloo, {n} ranks, "
              f"GLOO_SOCKET_IFNAME={env.get('GLOO_SOCKET_IFNAME', '(unset)')}, "
              f"MASTER_ADDR={env['MASTER_ADDR']}, host {socket.gethostname()}")
        print(f"#  minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}"
              f"(factor) warmup iters: {args.warmup_iters} iters: {args.iters} "
              f"validation: {args.check} average: 1 (mean over ranks)", flush=True)
    for coll in args.colls:
        call = make_call(coll)
        # Probe once at the smallest valid size; fall back or report unsupported.
        probe = next((layout(coll, s, n) for s in sizes if layout(coll, s, n)), None)
        if probe is None:
            continue
        try:
            s, r = slices(probe[1], probe[2], 0)
            call(s, r, probe[0])
        except (RuntimeError, AttributeError) as e:
            call = fallback(coll)
            err = e
            if call is not None:
                try:
                    s, r = slices(probe[1], probe[2], 0)
                    call(s, r, probe[0])
                except (RuntimeError, AttributeError) as e2:
                    call, err = None, e2
            if call is None:
                unsupported[coll] = f"{type(err).__name__}: {err}".splitlines()[0]
                if rank == 0:
                    print(f"#\n# {coll}: not supported by Gloo here ({unsupported[coll]})", flush=True)
                continue
        if rank == 0:
            print(f"#\n# {coll} (torch.distributed.{apis[coll]})\n"
                  f"#{'size':>11}  {'count':>12}  {'time':>9}  {'algbw':>7}  {'busbw':>7}  {'#wrong':>6}\n"
                  f"#{'(B)':>11}  {'(elements)':>12}  {'(us)':>9}  {'(GB/s)':>7}  {'(GB/s)':>7}", flush=True)
        valid = [s for s in sizes if layout(coll, s, n)]
        for end in (valid[-1], valid[0]):
            count, se, re_ = layout(coll, end, n)
            for w in range(args.warmup_iters):
                s, r = slices(se, re_, w)
                call(s, r, count)
        for size in valid:
            count, se, re_ = layout(coll, size, n)
            s, r = slices(se, re_, 0)
            call(s, r, count)  # untimed
            dist.barrier()
            t0 = time.perf_counter()
            for it in range(args.iters):
                s, r = slices(se, re_, it)
                call(s, r, count)
            mine = (time.perf_counter() - t0) / args.iters
            t, tmax = combine(mine)
            data = count * 4 * (1 if coll in ("allreduce", "bcast") else n)
            algbw = data / t / 1e9
            busbw = algbw * FACTOR.get(coll, lambda k: (k - 1) / k)(n)
            wrong = -1
            if args.check > 0:
                mine_wrong = sum(check_once(call, coll, count, se, re_) for _ in range(args.check))
                w = torch.tensor([mine_wrong], dtype=torch.int64)
                dist.all_reduce(w)
                wrong = int(w[0])
                failed |= wrong > 0
            row = {"collective": coll, "size": max(se, re_) * 4, "count": count,
                   "time_us": t * 1e6, "time_max_us": tmax * 1e6, "algbw": algbw,
                   "busbw": busbw, "nwrong": wrong}
            results.append(row)
            if rank == 0:
                print(f"{row['size']:12d}  {count:12d}  {t * 1e6:9.2f}  {algbw:7.3f}  {busbw:7.3f}  "
                      f"{'N/A' if wrong < 0 else wrong:>6}", flush=True)
    if rank == 0:
        print(f"# {'FAILED' if failed else 'OK'}", flush=True)
        if args.output_file:
            doc = {"tool": "gloo_bench.py", "library": f"torch {torch.__version__} gloo",
                   "nranks": n, "iters": args.iters, "warmup": args.warmup_iters, "average": 1,
                   "placement": "out_of_place (allreduce, bcast: in place)", "apis": apis, "unsupported": unsupported,
                   "gloo_socket_ifname": env.get("GLOO_SOCKET_IFNAME"),
                   "results": results, "ok": not failed}
            with open(args.output_file, "w") as f:
                json.dump(doc, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
