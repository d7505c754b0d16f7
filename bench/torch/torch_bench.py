# SPDX-License-Identifier: Apache-2.0
"""torch.distributed-level benchmark: the Chorus CPU backend vs gloo, in the same job.

What it measures: dist.all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, broadcast and all_to_all_single on float32 tensors
from 8 B to 64 MiB, once on the default group (backend under test, "chorus")
and once on a gloo group over the same ranks.  Both groups live in one job
and their iterations are interleaved (alternating which goes first) so both
see the same machine load -- on a shared host that matters more than
anything else.  Each iteration starts right after a barrier on a THIRD
(gloo) group used only for synchronisation, so neither measured backend pays
for or benefits from it; an iteration's time is the max over ranks, and the
reported time is the median over iterations.

Size convention (as nccl-tests): all_reduce/broadcast: the buffer;
all_gather_into_tensor: the OUTPUT; reduce_scatter_tensor: the INPUT;
all_to_all_single: each rank's send buffer.  algbw = size / time.

gloo in torch 1.13 has no all_gather_into_tensor (_allgather_base) and no
reduce_scatter at all.  On gloo those rows are emulated -- all_gather into
views of the output tensor (same data movement), and all_reduce of the whole
input followed by a copy of this rank's slice (what a gloo user would do;
more traffic than a true reduce-scatter) -- and are marked '*' in the table
and 'emulated' in the CSV.

A one-off correctness check per (op, size, backend) runs before timing; a
wrong result is reported as WRONG and makes the exit status non-zero.

Usage:
  bench/torch/torch_bench.sh <build-dir> [--quick] [--out-dir DIR] [--iters N]
or directly:
  PYTHONPATH=<build>/bindings/torch /usr/bin/python3 -m torch.distributed.run --nproc_per_node 3 \
      --redirects 9:1 --tee 9:1 --master_port 29515 bench/torch/torch_bench.py [options]
Writes <out-dir>/torch_bench.csv and <out-dir>/torch_bench.png (rank 0).
--backend-under-test gloo benchmarks gloo against itself (develops the script).
"""
import argparse
import datetime
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--backend-under-test", default=os.environ.get("CHORUS_TORCH_BACKEND_UNDER_TEST", "chorus"))
p.add_argument("--build-dir", default=None, help="adds <build-dir>/bindings/torch to sys.path")
p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
p.add_argument("--quick", action="store_true", help="few sizes, few iterations (CI smoke)")
p.add_argument("--iters", type=int, default=20, help="timed iterations per size (fewer above 1 MiB)")
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--min-bytes", type=int, default=8)
p.add_argument("--max-bytes", type=int, default=64 << 20)
p.add_argument("--step", type=int, default=4, help="size multiplier between rows")
p.add_argument("--ops", default="all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single")
p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
args = p.parse_args()

for d in ([os.path.join(args.build_dir, "bindings", "torch")] if args.build_dir else []) + \
         ([os.environ["CHORUS_TORCH_PATH"]] if os.environ.get("CHORUS_TORCH_PATH") else []):
    sys.path.insert(0, d)
if args.backend_under_test == "chorus":
    import chorus_torch  # noqa: F401  (registers the "chorus" backend)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(args.threads)
dist.init_process_group(args.backend_under_test, init_method="env://", timeout=datetime.timedelta(seconds=300))
RANK, WS = dist.get_rank(), dist.get_world_size()
UT_NAME = args.backend_under_test
UT_LABEL = UT_NAME if UT_NAME != "gloo" else "gloo(ut)"   # gloo-vs-gloo dev mode: keep the columns apart
GLOO = dist.new_group(backend="gloo")
SYNC = dist.new_group(backend="gloo")   # barriers and result gathering only; never timed

if args.quick:
    SIZES = [8, 4096, 256 << 10, 1 << 20]
    ITERS, WARMUP = 3, 1
else:
    SIZES, s = [], args.min_bytes
    while s <= args.max_bytes:
        SIZES.append(s)
        s *= args.step
    if SIZES[-1] != args.max_bytes:
        SIZES.append(args.max_bytes)
    ITERS, WARMUP = args.iters, args.warmup
OPS = args.ops.split(",")


def iters_for(nbytes):
    # keep big sizes from dominating the run time: ~constant bytes moved per size above 1 MiB
    if args.quick or nbytes <= (1 << 20):
        return ITERS
    return max(5, ITERS * (1 << 20) // nbytes)


def lacks(backend, op):
    """gloo (torch 1.13) lacks these; we emulate them (see module docstring)."""
    return backend == "gloo" and op in ("all_gather_into_tensor", "reduce_scatter_tensor")


def make(op, nbytes, group, backend):
    """Buffers + a zero-arg callable running one `op` of `nbytes` on `group`, and a checker."""
    n = max(1, nbytes // 4)
    per = max(1, n // WS)
    if op == "all_reduce":
        buf = torch.zeros(n)

        def run():
            dist.all_reduce(buf, group=group)

        def check():
            buf.fill_(RANK + 1)
            run()
            return bool(torch.all(buf == WS * (WS + 1) / 2))
        return run, check, n * 4
    if op == "broadcast":
        buf = torch.zeros(n)

        def run():
            dist.broadcast(buf, 0, group=group)

        def check():
            buf.fill_(RANK + 7)
            run()
            return bool(torch.all(buf == 7))
        return run, check, n * 4
    if op == "all_gather_into_tensor":
        out, inp = torch.zeros(per * WS), torch.zeros(per)
        if lacks(backend, op):
            views = list(out.chunk(WS))

            def run():
                dist.all_gather(views, inp, group=group)
        else:
            def run():
                dist.all_gather_into_tensor(out, inp, group=group)

        def check():
            inp.fill_(RANK + 1)
            run()
            return bool(torch.equal(out, torch.arange(1, WS + 1, dtype=torch.float32).repeat_interleave(per)))
        return run, check, per * WS * 4
    if op == "reduce_scatter_tensor":
        out, inp = torch.zeros(per), torch.zeros(per * WS)
        if lacks(backend, op):
            tmp = torch.zeros(per * WS)

            def run():
                tmp.copy_(inp)
                dist.all_reduce(tmp, group=group)
                out.copy_(tmp[RANK * per:(RANK + 1) * per])
        else:
            def run():
                dist.reduce_scatter_tensor(out, inp, group=group)

        def check():
            # Small integers (below 2^24 once summed), so that float32 holds every sum exactly.
            base = (torch.arange(per * WS) % 997).to(torch.float32)
            inp.copy_(base + RANK)
            run()
            exp = base[RANK * per:(RANK + 1) * per] * WS + WS * (WS - 1) / 2
            return bool(torch.equal(out, exp))
        return run, check, per * WS * 4
    if op == "all_to_all_single":
        out, inp = torch.zeros(per * WS), torch.zeros(per * WS)

        def run():
            dist.all_to_all_single(out, inp, group=group)

        def check():
            inp.copy_(torch.arange(WS, dtype=torch.float32).repeat_interleave(per) * 10 + RANK)
            run()
            return bool(torch.equal(out, torch.arange(WS, dtype=torch.float32).repeat_interleave(per) + RANK * 10))
        return run, check, per * WS * 4
    raise ValueError(op)


def timed(run):
    dist.barrier(group=SYNC)
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


rows = []
wrong = False
BACKENDS = [("gloo", GLOO), (UT_NAME, None)]
if RANK == 0:
    print("torch bench: %s (default group) vs gloo, %d ranks, %s mode, sizes %d B..%d B, %d iters (median)" %
          (UT_NAME, WS, "quick" if args.quick else "full", SIZES[0], SIZES[-1], ITERS), flush=True)
    print("%10s  %-24s %12s %12s %8s %10s %14s" % ("size(B)", "op", "gloo us", UT_LABEL + " us", "ratio",
                                                  "gloo GB/s", UT_LABEL + " GB/s"), flush=True)
for op in OPS:
    for nbytes in SIZES:
        runs, ok, real = [], [], None
        for idx, (bname, grp) in enumerate(BACKENDS):
            run, check, real = make(op, nbytes, grp, "gloo" if idx == 0 else UT_NAME)
            ok.append(check())
            runs.append(run)
        for _ in range(WARMUP):
            for r in runs:
                timed(r)
        times = [[], []]
        for i in range(iters_for(real)):
            order = (0, 1) if i % 2 == 0 else (1, 0)   # alternate who goes first: neither always gets a warm cache
            for b in order:
                times[b].append(timed(runs[b]))
        # per-iteration max over ranks (a collective is done when its slowest rank is), then median
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=SYNC)
        okt = torch.tensor([int(not x) for x in ok])
        dist.all_reduce(okt, group=SYNC)   # number of ranks that saw a wrong result, per backend
        med = [statistics.median(t[b].tolist()) for b in range(2)]
        bad = [okt[b].item() > 0 for b in range(2)]
        wrong = wrong or any(bad)
        ratio = med[0] / med[1] if med[1] > 0 else float("nan")
        row = dict(size_bytes=real, op=op, gloo_us=med[0] * 1e6, ut_us=med[1] * 1e6, ratio=ratio,
                   gloo_algbw_GBps=real / med[0] / 1e9, ut_algbw_GBps=real / med[1] / 1e9,
                   iters=iters_for(real), gloo_emulated=int(lacks("gloo", op)), ut_emulated=int(lacks(UT_NAME, op)),
                   gloo_wrong=int(bad[0]), ut_wrong=int(bad[1]))
        rows.append(row)
        if RANK == 0:
            print("%10d  %-24s %11.1f%s %11.1f%s %8.2f %10.3f %10.3f%s" % (
                real, op, row["gloo_us"], "*" if row["gloo_emulated"] else " ", row["ut_us"],
                "*" if row["ut_emulated"] else " ", ratio, row["gloo_algbw_GBps"], row["ut_algbw_GBps"],
                ("  WRONG(" + ",".join(n for n, b in zip(["gloo", UT_NAME], bad) if b) + ")") if any(bad) else ""),
                flush=True)

if RANK == 0:
    print("ratio = gloo time / %s time (>1: %s faster); * = emulated (gloo lacks the op in torch 1.13)" %
          (UT_LABEL, UT_LABEL), flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, "torch_bench.csv")
    with open(csv_path, "w") as f:
        cols = list(rows[0].keys())
        f.write("# backend_under_test=%s world_size=%d mode=%s ut_* columns are %s\n" %
                (UT_NAME, WS, "quick" if args.quick else "full", UT_NAME))
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(("%.6g" % r[c]) if isinstance(r[c], float) else str(r[c]) for c in cols) + "\n")
    print("wrote", csv_path, flush=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
        for op in OPS:
            rs = [r for r in rows if r["op"] == op]
            x = [r["size_bytes"] for r in rs]
            line, = ax1.plot(x, [r["ratio"] for r in rs], marker="o", label=op + (" (gloo emulated)" if lacks("gloo", op) else ""))
            ax2.plot(x, [r["ut_us"] for r in rs], marker="o", color=line.get_color(), label=op + " " + UT_LABEL)
            ax2.plot(x, [r["gloo_us"] for r in rs], marker="x", linestyle="--", color=line.get_color(), label=op + " gloo")
        ax1.axhline(1.0, color="grey", linewidth=1)
        ax1.set_xscale("log", base=2)
        ax1.set_xlabel("size (bytes)")
        ax1.set_yscale("log")   # ratios: 2x faster and 2x slower should look symmetric
        ax1.set_ylabel("gloo time / %s time  (>1: %s faster)" % (UT_LABEL, UT_LABEL))
        ax1.set_title("torch.distributed CPU, %d ranks: %s vs gloo" % (WS, UT_LABEL))
        ax1.legend(fontsize=7)
        ax1.grid(True, which="both", alpha=0.3)
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log")
        ax2.set_xlabel("size (bytes)")
        ax2.set_ylabel("median time (us)")
        ax2.set_title("median latency (solid %s, dashed gloo)" % UT_LABEL)
        ax2.legend(fontsize=6, ncol=2)
        ax2.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        png = os.path.join(args.out_dir, "torch_bench.png")
        fig.savefig(png, dpi=110)
        print("wrote", png, flush=True)
    except Exception as e:  # a missing matplotlib must not hide the numbers already printed
        print("plot skipped: %s" % e, flush=True)

dist.barrier(group=SYNC)
if wrong:
    print("torch bench: WRONG results seen (see table)", flush=True)
    sys.exit(1)
dist.destroy_process_group()
