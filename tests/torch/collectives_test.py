# SPDX-License-Identifier: Apache-2.0
"""Correctness of every torch.distributed collective on the Chorus CPU backend.

What it proves: for each collective x dtype x reduce-op that the "chorus"
backend promises (the contract is spelled out in DTYPES, OPS and dtypes_for below),
every rank's result equals what gloo -- run in the SAME job on a second group
over all ranks -- produces, or, where gloo in torch 1.13 cannot do the
op/dtype, what a local reference computes from all ranks' inputs.  Every
rank's input is random (non-integer for floating types) and is a pure function
of (1000 + rank, check name), so any rank can reproduce any other rank's input
locally; that is what makes the local reference possible.

Also covered: async_op=True + wait(), get_future().wait(), non-contiguous
(transposed) tensors written in place, a new_group([0, world-1]) subgroup,
send/recv, isend/irecv, batch_isend_irecv rings, all_to_all(_single) with
uneven splits, gather, scatter, barrier.

Usage (3 ranks; also works with 2 and 4):
  PYTHONPATH=<build>/bindings/torch /usr/bin/python3 -m torch.distributed.run \
      --nproc_per_node 3 --redirects 9:1 --tee 9:1 --master_port 29512 \
      tests/torch/collectives_test.py [--backend-under-test gloo] [--build-dir <build>]
(--redirects/--tee work around torchrun's Python 3.11 crash, pytorch#92319.)

With --backend-under-test gloo the default group is gloo too.  gloo lacks
some ops (reduce_scatter, all_gather_into_tensor, all_to_all, AVG, bfloat16,
bool); in that mode they are EMULATED on top of gloo (see GlooEmulation) so
that the test plumbing and the local references are exercised, but that
mode proves nothing about Chorus.

Exit status 0 iff every check passed; each mismatch is printed with the
check name, rank, and the first differing elements.
"""
import os
import sys
import traceback
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_test_common as common  # noqa: E402

args = common.parse_args("Chorus torch backend collective correctness test")
common.import_backend(args)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

common.start_watchdog(args.watchdog_s, "collectives_test")
RANK, WS = common.init_default_group(args)
UT_NAME = args.backend_under_test
# The reference group: gloo over all ranks, in the same job as the group under test.
GLOO = dist.new_group(backend="gloo")

R = dist.ReduceOp
F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
I8, U8, I32, I64, BOOL = torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool
FLOATS = [F32, F64, F16, BF16]
INTS = [I8, U8, I32, I64]
DTYPES = FLOATS + INTS
OPS = [("SUM", R.SUM), ("PRODUCT", R.PRODUCT), ("MIN", R.MIN), ("MAX", R.MAX), ("AVG", R.AVG),
       ("BAND", R.BAND), ("BOR", R.BOR), ("BXOR", R.BXOR)]
BITWISE = ("BAND", "BOR", "BXOR")


def dtypes_for(opname):
    """The contract: AVG only for floating types, bitwise ops only for integers and bool."""
    if opname == "AVG":
        return FLOATS
    if opname in BITWISE:
        return INTS + [BOOL]
    return DTYPES


def dname(dt):
    return str(dt).replace("torch.", "")


# ---------------------------------------------------------------- inputs
def make_input(rank, key, shape, dtype, opname="SUM"):
    """Deterministic input of `rank` for check `key`.

    Seeded from (1000 + rank, crc32(key)) so every rank can rebuild every
    other rank's input for the local reference.  Floats are non-integer (so an
    implementation that truncates or reduces in an integer type is caught);
    ranges are small so SUM stays exact-ish in half precision and PRODUCT of
    up to 4 ranks cannot overflow int8/uint8 (3^4 = 81)."""
    g = torch.Generator().manual_seed((1000 + rank) * 1000003 + zlib.crc32(key.encode()))
    if dtype in FLOATS:
        if opname == "PRODUCT":
            x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5   # [0.5, 1.5): no under/overflow
        else:
            x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1  # [-1, 1)
        return x.to(dtype)
    if dtype == BOOL:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo = 0 if dtype == U8 else -3
    return torch.randint(lo, 4, shape, generator=g, dtype=torch.int64).to(dtype)


def all_inputs(key, shape, dtype, opname="SUM", ranks=None):
    return [make_input(r, key, shape, dtype, opname) for r in (range(WS) if ranks is None else ranks)]


def ref_reduce(tensors, opname, dtype):
    """Reduce a list of tensors elementwise the way a collective should.

    Floats are reduced in float64 and rounded once to `dtype`; an
    implementation that accumulates in the narrow type differs by a few ulps,
    which the dtype tolerance in check_close() allows."""
    if dtype == BOOL:
        s = torch.stack(tensors)
        if opname == "BAND":
            return s.all(0)
        if opname == "BOR":
            return s.any(0)
        if opname == "BXOR":
            return (s.to(torch.int64).sum(0) % 2).bool()
        raise ValueError(opname)
    if dtype in FLOATS:
        s = torch.stack([t.to(torch.float64) for t in tensors])
    else:
        s = torch.stack([t.to(torch.int64) for t in tensors])
    if opname == "SUM":
        r = s.sum(0)
    elif opname == "PRODUCT":
        r = s.prod(0)
    elif opname == "MIN":
        r = s.min(0).values
    elif opname == "MAX":
        r = s.max(0).values
    elif opname == "AVG":
        r = s.mean(0)
    elif opname in BITWISE:
        r = s[0].clone()
        for t in s[1:]:
            r = (r & t) if opname == "BAND" else (r | t) if opname == "BOR" else (r ^ t)
    else:
        raise ValueError(opname)
    return r.to(dtype)


# ---------------------------------------------------------------- what gloo (torch 1.13) can do
# Determined empirically on torch 1.13 (Debian): gloo raises "Invalid scalar type" for bfloat16 and
# bool in every collective (p2p works), "Cannot use ReduceOp.AVG with Gloo", and does not implement
# reduce_scatter, _reduce_scatter_base (reduce_scatter_tensor), _allgather_base
# (all_gather_into_tensor) or alltoall (list form).  We decide from this table rather than try/except
# because an exception raised on only some ranks would desynchronise the job.
GLOO_LACKS_OPS = {"reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all"}


def gloo_can(coll, dtype, opname=None):
    if coll in GLOO_LACKS_OPS:
        return False
    if dtype in (BF16, BOOL):
        return False
    if opname == "AVG":
        return False
    return True


# ---------------------------------------------------------------- the backend under test
class UnderTest:
    """Calls the collective on the group under test.

    When the backend under test is gloo itself (development mode), ops/dtypes
    gloo lacks are emulated on gloo so the rest of the test (inputs, local
    references, comparisons) still runs; results are written into the
    caller's tensors in place, as the real backend must do."""

    def __init__(self, group=None):
        self.group = group
        self.emulate = UT_NAME == "gloo"

    def _size(self):
        return dist.get_world_size(self.group)

    def _cast(self, t):
        if not self.emulate:
            return t, None
        if t.dtype == BF16:
            return t.to(F32), BF16
        if t.dtype == BOOL:
            return t.to(U8), BOOL
        return t, None

    def all_reduce(self, t, op, opname, async_op=False):
        # gloo rejects strided (non-dense) tensors: emulate on a contiguous copy
        if self.emulate and (opname == "AVG" or t.dtype in (BF16, BOOL) or not t.is_contiguous()):
            w, _ = self._cast(t)
            w = w.contiguous().clone() if w is t else w.contiguous()
            dist.all_reduce(w, op=R.SUM if opname == "AVG" else op, group=self.group)
            if opname == "AVG":
                w = w / self._size()
            t.copy_(w)
            return None
        return dist.all_reduce(t, op=op, group=self.group, async_op=async_op)

    def reduce(self, t, dst, op, opname):
        if self.emulate and (opname == "AVG" or t.dtype in (BF16, BOOL)):
            w, _ = self._cast(t)
            w = w.clone() if w is t else w
            dist.reduce(w, dst, op=R.SUM if opname == "AVG" else op, group=self.group)
            if dist.get_rank() == dst:
                t.copy_(w / self._size() if opname == "AVG" else w)
            return
        dist.reduce(t, dst, op=op, group=self.group)

    def broadcast(self, t, src, async_op=False):
        if self.emulate and t.dtype in (BF16, BOOL):
            w, _ = self._cast(t)
            dist.broadcast(w, src, group=self.group)
            t.copy_(w)
            return None
        return dist.broadcast(t, src, group=self.group, async_op=async_op)

    def all_gather(self, outs, t, async_op=False):
        if self.emulate and t.dtype in (BF16, BOOL):
            w, _ = self._cast(t)
            wo = [torch.empty_like(w) for _ in outs]
            dist.all_gather(wo, w, group=self.group)
            for o, x in zip(outs, wo):
                o.copy_(x)
            return None
        return dist.all_gather(outs, t, group=self.group, async_op=async_op)

    def all_gather_into_tensor(self, out, t):
        if self.emulate:
            chunks = list(out.chunk(self._size()))
            self.all_gather(chunks, t)   # views into `out`: emulation writes in place
            return
        dist.all_gather_into_tensor(out, t, group=self.group)

    def reduce_scatter(self, out, ins, op, opname):
        if self.emulate:
            full = torch.cat([x.reshape(-1) for x in ins])
            self.all_reduce(full, op, opname)
            me = dist.get_rank(self.group)
            off = sum(x.numel() for x in ins[:me])
            out.copy_(full[off:off + out.numel()].view_as(out))
            return
        dist.reduce_scatter(out, ins, op=op, group=self.group)

    def reduce_scatter_tensor(self, out, inp, op, opname):
        if self.emulate:
            self.reduce_scatter(out, list(inp.chunk(self._size())), op, opname)
            return
        dist.reduce_scatter_tensor(out, inp, op=op, group=self.group)

    def all_to_all(self, outs, ins):
        if self.emulate:
            wi, _ = self._cast(torch.cat(ins))
            wo, _ = self._cast(torch.empty(sum(o.numel() for o in outs), dtype=outs[0].dtype))
            dist.all_to_all_single(wo, wi, [o.numel() for o in outs], [i.numel() for i in ins], group=self.group)
            off = 0
            for o in outs:
                o.copy_(wo[off:off + o.numel()])
                off += o.numel()
            return
        dist.all_to_all(outs, ins, group=self.group)

    def all_to_all_single(self, out, inp, osplit, isplit):
        if self.emulate and inp.dtype in (BF16, BOOL):
            wi, _ = self._cast(inp)
            wo, _ = self._cast(out)
            wo = wo.clone() if wo is out else wo
            dist.all_to_all_single(wo, wi, osplit, isplit, group=self.group)
            out.copy_(wo)
            return
        dist.all_to_all_single(out, inp, osplit, isplit, group=self.group)

    def gather(self, t, gl, dst):
        if self.emulate and t.dtype in (BF16, BOOL):
            w, _ = self._cast(t)
            wl = [torch.empty_like(w) for _ in gl] if gl is not None else None
            dist.gather(w, wl, dst, group=self.group)
            if gl is not None:
                for o, x in zip(gl, wl):
                    o.copy_(x)
            return
        dist.gather(t, gl, dst, group=self.group)

    def scatter(self, out, sl, src):
        if self.emulate and out.dtype in (BF16, BOOL):
            w, _ = self._cast(out)
            w = w.clone() if w is out else w
            wl = [self._cast(x)[0] for x in sl] if sl is not None else None
            dist.scatter(w, wl, src, group=self.group)
            out.copy_(w)
            return
        dist.scatter(out, sl, src, group=self.group)

    def send(self, t, dst):
        # gloo rejects non-contiguous p2p buffers; the contract says chorus must accept them.
        dist.send(t.contiguous() if self.emulate else t, dst, group=self.group)

    def recv(self, t, src):
        if self.emulate and not t.is_contiguous():
            w = torch.empty(t.shape, dtype=t.dtype)
            dist.recv(w, src, group=self.group)
            t.copy_(w)
            return
        dist.recv(t, src, group=self.group)


UT = UnderTest()


# ---------------------------------------------------------------- checking
class Stats:
    def __init__(self):
        self.passed = 0
        self.failed = []
        self.group_pass = 0
        self.group_fail = 0
        self.by_ref = {}


S = Stats()

TOL = {F32: (1e-5, 1e-6), F64: (1e-12, 1e-12), F16: (1e-2, 1e-2), BF16: (2e-2, 5e-2)}


def describe_diff(got, exp):
    g = got.reshape(-1).to(torch.float64) if got.dtype != BOOL else got.reshape(-1).to(torch.int64)
    e = exp.reshape(-1).to(torch.float64) if exp.dtype != BOOL else exp.reshape(-1).to(torch.int64)
    if g.shape != e.shape:
        return "shape %s vs expected %s" % (tuple(got.shape), tuple(exp.shape))
    bad = (g != e).nonzero().reshape(-1)[:4].tolist()
    return "; ".join("[%d] got %r expected %r" % (i, g[i].item(), e[i].item()) for i in bad)


def check(name, got, exp, exact=True, ref="local"):
    """Compare one result.  exact=True for data movement (bit-exact), else a dtype tolerance."""
    ok = got.shape == exp.shape and got.dtype == exp.dtype
    if ok:
        if exact or got.dtype not in TOL:
            ok = torch.equal(got, exp)
        else:
            rtol, atol = TOL[got.dtype]
            ok = torch.allclose(got.to(torch.float64), exp.to(torch.float64), rtol=rtol, atol=atol)
    S.by_ref[ref] = S.by_ref.get(ref, 0) + 1
    if ok:
        S.passed += 1
        S.group_pass += 1
    else:
        S.group_fail += 1
        msg = "MISMATCH rank %d: %s (vs %s ref; got %s %s, expected %s %s): %s" % (
            RANK, name, ref, got.dtype, tuple(got.shape), exp.dtype, tuple(exp.shape), describe_diff(got, exp))
        S.failed.append(msg)
        print(msg, flush=True)


def check_vs(name, got, exact, gloo_result, local):
    """Compare against gloo's result when gloo could run it, else against the local reference.

    When gloo ran, gloo is also compared with the local reference: that
    validates the local references (which are all we have for the ops gloo
    lacks) on every run."""
    if gloo_result is not None:
        check(name, got, gloo_result, exact, ref="gloo")
        check(name + " [gloo vs local ref]", gloo_result, local, exact, ref="gloo-vs-local")
    else:
        check(name, got, local, exact, ref="local")


class guard:
    """Context manager around ONE check: an exception in it becomes a recorded failure, not an abort.

    So that a backend rejecting, say, BXOR does not hide the results of every later check.  It is only
    safe to go on if every rank raised (e.g. argument validation) -- otherwise the ranks are out of
    step -- so the ranks compare notes over gloo, and the job aborts if only some of them raised."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        common.CURRENT[0] = self.name
        return self

    def __exit__(self, et, ev, tb):
        raised = et is not None and issubclass(et, Exception)
        if raised:
            msg = "EXCEPTION rank %d: %s: %s: %s" % (RANK, self.name, et.__name__, str(ev).strip().replace("\n", " | "))
            S.failed.append(msg)
            S.group_fail += 1
            print(msg, flush=True)
        flag = torch.tensor([int(raised)])
        dist.all_reduce(flag, group=GLOO)
        if 0 < flag.item() < WS:
            print("rank %d: only %d of %d ranks raised in '%s'; ranks are out of step, aborting" %
                  (RANK, flag.item(), WS, self.name), flush=True)
            if raised:
                traceback.print_exception(et, ev, tb)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        return raised   # suppress: all ranks raised, they are still in step


def group(title):
    """Decorator: run a group of checks, print one summary line."""
    def deco(fn):
        S.group_pass = S.group_fail = 0
        common.CURRENT[0] = title
        try:
            fn()
        except Exception:
            # An exception in a collective (on only this rank, possibly) cannot be survived
            # without desynchronising the other ranks, so stop the whole job now.
            print("EXCEPTION on rank %d in group '%s':" % (RANK, title), flush=True)
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        status = "ok" if S.group_fail == 0 else "FAILED (%d mismatches)" % S.group_fail
        print("[rank %d] %-34s %4d checks %s" % (RANK, title, S.group_pass + S.group_fail, status), flush=True)
        return fn
    return deco


N = 37  # small, odd element count: exercises non-multiple-of-world-size and non-vectorised tails


# ---------------------------------------------------------------- the checks
@group("all_reduce (dtype x op)")
def _():
    for opname, op in OPS:
        for dt in dtypes_for(opname):
            key = "allreduce/%s/%s" % (opname, dname(dt))
            with guard(key):
                mine = make_input(RANK, key, (N,), dt, opname)
                got = mine.clone()
                UT.all_reduce(got, op, opname)
                g = None
                if gloo_can("all_reduce", dt, opname):
                    g = mine.clone()
                    dist.all_reduce(g, op=op, group=GLOO)
                check_vs(key, got, opname in ("MIN", "MAX") + BITWISE or dt not in FLOATS, g,
                         ref_reduce(all_inputs(key, (N,), dt, opname), opname, dt))


@group("reduce (dtype x op, rotating root)")
def _():
    i = 0
    for opname, op in OPS:
        for dt in dtypes_for(opname):
            root = i % WS
            i += 1
            key = "reduce/%s/%s" % (opname, dname(dt))
            with guard(key):
                mine = make_input(RANK, key, (N,), dt, opname)
                got = mine.clone()
                UT.reduce(got, root, op, opname)
                g = None
                if gloo_can("reduce", dt, opname):
                    g = mine.clone()
                    dist.reduce(g, root, op=op, group=GLOO)
                if RANK == root:  # only the root's buffer is defined after reduce
                    check_vs(key + "/root%d" % root, got, opname in ("MIN", "MAX") + BITWISE or dt not in FLOATS, g,
                             ref_reduce(all_inputs(key, (N,), dt, opname), opname, dt))


@group("broadcast (dtype x root)")
def _():
    for dt in DTYPES + [BOOL]:
        for root in range(WS):
            key = "bcast/%s/%d" % (dname(dt), root)
            with guard(key):
                mine = make_input(RANK, key, (N,), dt)
                got = mine.clone()
                UT.broadcast(got, root)
                g = None
                if gloo_can("broadcast", dt):
                    g = mine.clone()
                    dist.broadcast(g, root, group=GLOO)
                check_vs(key, got, True, g, make_input(root, key, (N,), dt))


@group("all_gather (list)")
def _():
    for dt in DTYPES + [BOOL]:
        key = "allgather/%s" % dname(dt)
        with guard(key):
            mine = make_input(RANK, key, (N,), dt)
            outs = [torch.zeros(N, dtype=dt) for _ in range(WS)]
            UT.all_gather(outs, mine)
            g = None
            if gloo_can("all_gather", dt):
                gl = [torch.zeros(N, dtype=dt) for _ in range(WS)]
                dist.all_gather(gl, mine, group=GLOO)
                g = torch.stack(gl)
            check_vs(key, torch.stack(outs), True, g, torch.stack(all_inputs(key, (N,), dt)))


@group("all_gather_into_tensor")
def _():
    # gloo in torch 1.13 has no _allgather_base: local reference only.
    for dt in DTYPES + [BOOL]:
        key = "allgather_t/%s" % dname(dt)
        with guard(key):
            mine = make_input(RANK, key, (N,), dt)
            out = torch.zeros(WS * N, dtype=dt)
            UT.all_gather_into_tensor(out, mine)
            check(key, out, torch.cat(all_inputs(key, (N,), dt)))
            # 2-D form: output (WS*rows, cols) stacked along dim 0
            key2 = key + "/2d"
            mine2 = make_input(RANK, key2, (3, 5), dt)
            out2 = torch.zeros(WS * 3, 5, dtype=dt)
            UT.all_gather_into_tensor(out2, mine2)
            check(key2, out2, torch.cat(all_inputs(key2, (3, 5), dt)))


@group("reduce_scatter (list, dtype x op)")
def _():
    # gloo in torch 1.13 has no reduce_scatter: local reference only.
    for opname, op in OPS:
        for dt in dtypes_for(opname):
            key = "rs/%s/%s" % (opname, dname(dt))
            with guard(key):
                # rank r's input list: WS tensors of N elements; slot j is reduced into rank j's output
                full = [make_input(r, key, (WS, N), dt, opname) for r in range(WS)]
                out = torch.zeros(N, dtype=dt)
                UT.reduce_scatter(out, list(full[RANK].clone().unbind(0)), op, opname)
                exp = ref_reduce([f[RANK] for f in full], opname, dt)
                check(key, out, exp, opname in ("MIN", "MAX") + BITWISE or dt not in FLOATS)


@group("reduce_scatter_tensor (dtype x op)")
def _():
    for opname, op in OPS:
        for dt in dtypes_for(opname):
            key = "rst/%s/%s" % (opname, dname(dt))
            with guard(key):
                full = [make_input(r, key, (WS * N,), dt, opname) for r in range(WS)]
                out = torch.zeros(N, dtype=dt)
                UT.reduce_scatter_tensor(out, full[RANK].clone(), op, opname)
                exp = ref_reduce([f[RANK * N:(RANK + 1) * N] for f in full], opname, dt)
                check(key, out, exp, opname in ("MIN", "MAX") + BITWISE or dt not in FLOATS)


@group("all_to_all (list, uneven)")
def _():
    # rank r sends (r + j + 1) elements to rank j; gloo lacks alltoall: local reference.
    for dt in DTYPES + [BOOL]:
        key = "a2a/%s" % dname(dt)
        with guard(key):
            ins = [make_input(RANK, key + "/to%d" % j, (RANK + j + 1,), dt) for j in range(WS)]
            outs = [torch.zeros(j + RANK + 1, dtype=dt) for j in range(WS)]
            UT.all_to_all(outs, ins)
            for j in range(WS):
                check(key + "/from%d" % j, outs[j], make_input(j, key + "/to%d" % RANK, (j + RANK + 1,), dt))


@group("all_to_all_single (uneven splits)")
def _():
    for dt in DTYPES + [BOOL]:
        key = "a2as/%s" % dname(dt)
        with guard(key):
            isplit = [RANK + j + 1 for j in range(WS)]  # what I send to j
            osplit = [j + RANK + 1 for j in range(WS)]  # what j sends me
            mine = make_input(RANK, key, (sum(isplit),), dt)
            out = torch.zeros(sum(osplit), dtype=dt)
            UT.all_to_all_single(out, mine, osplit, isplit)
            exp = []
            for j in range(WS):
                theirs = make_input(j, key, (sum(j + k + 1 for k in range(WS)),), dt)
                off = sum(j + k + 1 for k in range(RANK))
                exp.append(theirs[off:off + j + RANK + 1])
            exp = torch.cat(exp)
            g = None
            if gloo_can("all_to_all_single", dt):
                g = torch.zeros(sum(osplit), dtype=dt)
                dist.all_to_all_single(g, mine, osplit, isplit, group=GLOO)
            check_vs(key, out, True, g, exp)
            # even split form (no split lists)
            key2 = key + "/even"
            mine2 = make_input(RANK, key2, (WS * 4,), dt)
            out2 = torch.zeros(WS * 4, dtype=dt)
            UT.all_to_all_single(out2, mine2, None, None)
            exp2 = torch.cat([make_input(j, key2, (WS * 4,), dt)[RANK * 4:(RANK + 1) * 4] for j in range(WS)])
            check(key2, out2, exp2)


@group("gather (dtype)")
def _():
    for dt in DTYPES + [BOOL]:
        dst = 1 % WS
        key = "gather/%s" % dname(dt)
        with guard(key):
            mine = make_input(RANK, key, (N,), dt)
            gl = [torch.zeros(N, dtype=dt) for _ in range(WS)] if RANK == dst else None
            UT.gather(mine, gl, dst)
            g = None
            if gloo_can("gather", dt):
                ggl = [torch.zeros(N, dtype=dt) for _ in range(WS)] if RANK == dst else None
                dist.gather(mine, ggl, dst, group=GLOO)
                g = torch.stack(ggl) if RANK == dst else None
            if RANK == dst:
                check_vs(key, torch.stack(gl), True, g, torch.stack(all_inputs(key, (N,), dt)))


@group("scatter (dtype)")
def _():
    for dt in DTYPES + [BOOL]:
        src = WS - 1
        key = "scatter/%s" % dname(dt)
        with guard(key):
            srcdata = make_input(src, key, (WS, N), dt)
            sl = list(srcdata.clone().unbind(0)) if RANK == src else None
            out = torch.zeros(N, dtype=dt)
            UT.scatter(out, sl, src)
            g = None
            if gloo_can("scatter", dt):
                g = torch.zeros(N, dtype=dt)
                dist.scatter(g, list(srcdata.clone().unbind(0)) if RANK == src else None, src, group=GLOO)
            check_vs(key, out, True, g, srcdata[RANK])


@group("barrier")
def _():
    for _ in range(3):
        dist.barrier()
        S.passed += 1
        S.group_pass += 1


@group("send/recv (every ordered pair)")
def _():
    # One pair at a time, globally ordered, so even a blocking, rendezvous-style send cannot deadlock.
    for dt in DTYPES + [BOOL]:
        for src in range(WS):
            for dst in range(WS):
                if src == dst:
                    continue
                key = "p2p/%s/%d->%d" % (dname(dt), src, dst)
                with guard(key):
                    if RANK == src:
                        dist.send(make_input(src, key, (N,), dt), dst)
                    elif RANK == dst:
                        t = torch.zeros(N, dtype=dt)
                        dist.recv(t, src)
                        check(key, t, make_input(src, key, (N,), dt))


@group("batch_isend_irecv ring")
def _():
    for dt in DTYPES:
        key = "bring/%s" % dname(dt)
        with guard(key):
            nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
            a = torch.zeros(N, dtype=dt)
            b = torch.zeros(2 * N, dtype=dt)
            ops = [dist.P2POp(dist.isend, make_input(RANK, key + "/fwd", (N,), dt), nxt),
                   dist.P2POp(dist.irecv, a, prv),
                   dist.P2POp(dist.isend, make_input(RANK, key + "/bwd", (2 * N,), dt), prv),
                   dist.P2POp(dist.irecv, b, nxt)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            check(key + "/from-prev", a, make_input(prv, key + "/fwd", (N,), dt))
            check(key + "/from-next", b, make_input(nxt, key + "/bwd", (2 * N,), dt))


@group("async_op=True + wait / get_future")
def _():
    key = "async/allreduce"
    mine = make_input(RANK, key, (N,), F32)
    exp = ref_reduce(all_inputs(key, (N,), F32), "SUM", F32)
    t = mine.clone()
    w = UT.all_reduce(t, R.SUM, "SUM", async_op=True)
    w.wait()
    check(key + "/wait", t, exp, exact=False)
    check(key + "/is_completed", torch.tensor(bool(w.is_completed())), torch.tensor(True))

    t2 = mine.clone()
    w2 = UT.all_reduce(t2, R.SUM, "SUM", async_op=True)
    res = w2.get_future().wait()
    # The future's value is the list of output tensors (DDP relies on this).
    check(key + "/future-value", res[0], exp, exact=False)
    check(key + "/future-inplace", t2, exp, exact=False)

    # several outstanding ops, waited in reverse order
    ts = [make_input(RANK, key + "/multi%d" % i, (N,), F64) for i in range(3)]
    wk = [UT.all_reduce(x, R.MAX, "MAX", async_op=True) for x in ts]
    for w in reversed(wk):
        w.wait()
    for i, x in enumerate(ts):
        check(key + "/multi%d" % i, x, ref_reduce(all_inputs(key + "/multi%d" % i, (N,), F64), "MAX", F64))

    kb = "async/bcast"
    b = make_input(RANK, kb, (N,), I32)
    UT.broadcast(b, 0, async_op=True).wait()
    check(kb, b, make_input(0, kb, (N,), I32))

    kg = "async/allgather"
    outs = [torch.zeros(N, dtype=F32) for _ in range(WS)]
    fut = UT.all_gather(outs, make_input(RANK, kg, (N,), F32), async_op=True).get_future()
    fut.wait()
    check(kg, torch.stack(outs), torch.stack(all_inputs(kg, (N,), F32)))


@group("non-contiguous (transposed views)")
def _():
    for dt in (F32, F64, I32, BF16):
        # all_reduce on a transposed view: the result must land IN the view (i.e. in the base tensor).
        with guard("nc/%s" % dname(dt)):
            key = "nc/allreduce/%s" % dname(dt)
            base = make_input(RANK, key, (6, 5), dt)
            view = base.t()
            assert not view.is_contiguous()
            UT.all_reduce(view, R.SUM, "SUM")
            exp = ref_reduce([x.t() for x in all_inputs(key, (6, 5), dt)], "SUM", dt)
            g = None
            if gloo_can("all_reduce", dt):
                g = make_input(RANK, key, (6, 5), dt).t().contiguous()
                dist.all_reduce(g, group=GLOO)
            check_vs(key, view.contiguous(), dt not in FLOATS, g, exp)
            check(key + "/base-updated", base, exp.t().contiguous(), dt not in FLOATS)

            key = "nc/bcast/%s" % dname(dt)
            base = make_input(RANK, key, (4, 7), dt)
            view = base.t()
            UT.broadcast(view, WS - 1)
            check(key, base, make_input(WS - 1, key, (4, 7), dt))

            key = "nc/allgather-input/%s" % dname(dt)
            mine = make_input(RANK, key, (5, 3), dt).t()   # non-contiguous input
            outs = [torch.zeros(3, 5, dtype=dt) for _ in range(WS)]
            UT.all_gather(outs, mine)
            check(key, torch.stack(outs), torch.stack([x.t() for x in all_inputs(key, (5, 3), dt)]))

            key = "nc/reduce/%s" % dname(dt)
            base = make_input(RANK, key, (3, 4), dt)
            UT.reduce(base.t(), 0, R.MAX, "MAX")
            if RANK == 0:
                check(key, base, ref_reduce(all_inputs(key, (3, 4), dt), "MAX", dt))

            key = "nc/p2p/%s" % dname(dt)
            if WS >= 2:
                if RANK == 0:
                    UT.send(make_input(0, key, (4, 6), dt).t(), 1)
                elif RANK == 1:
                    base = torch.zeros(4, 6, dtype=dt)
                    UT.recv(base.t(), 0)   # receive into a non-contiguous view
                    check(key, base, make_input(0, key, (4, 6), dt))

            # a strided (every other element) slice, not just a transpose
            key = "nc/allreduce-strided/%s" % dname(dt)
            base = make_input(RANK, key, (2 * N,), dt)
            before = base.clone()
            UT.all_reduce(base[::2], R.SUM, "SUM")
            exp = before.clone()
            exp[::2] = ref_reduce([x[::2] for x in all_inputs(key, (2 * N,), dt)], "SUM", dt)
            check(key + "/odd-untouched", base[1::2], before[1::2])
            check(key, base[::2], exp[::2], dt not in FLOATS)


@group("new_group([0, world-1]) subgroup")
def _():
    members = sorted({0, WS - 1})
    # new_group must be called by every rank, members or not.
    sub = dist.new_group(members, backend=UT_NAME)
    gsub = dist.new_group(members, backend="gloo")
    if RANK not in members:
        return
    sut = UnderTest(sub)
    for dt in (F32, I32, F16):
        key = "sub/allreduce/%s" % dname(dt)
        mine = make_input(RANK, key, (N,), dt)
        got = mine.clone()
        sut.all_reduce(got, R.SUM, "SUM")
        g = mine.clone()
        dist.all_reduce(g, group=gsub)
        check_vs(key, got, dt not in FLOATS, g, ref_reduce(all_inputs(key, (N,), dt, ranks=members), "SUM", dt))

        key = "sub/bcast/%s" % dname(dt)
        got = make_input(RANK, key, (N,), dt)
        sut.broadcast(got, WS - 1)   # src is a GLOBAL rank
        check(key, got, make_input(WS - 1, key, (N,), dt))

        key = "sub/allgather/%s" % dname(dt)
        outs = [torch.zeros(N, dtype=dt) for _ in members]
        sut.all_gather(outs, make_input(RANK, key, (N,), dt))
        check(key, torch.stack(outs), torch.stack(all_inputs(key, (N,), dt, ranks=members)))
    key = "sub/rst"
    full = [make_input(r, key, (len(members) * N,), F32) for r in members]
    out = torch.zeros(N, dtype=F32)
    me = members.index(RANK)
    sut.reduce_scatter_tensor(out, full[me].clone(), R.SUM, "SUM")
    check(key, out, ref_reduce([f[me * N:(me + 1) * N] for f in full], "SUM", F32), exact=False)
    dist.barrier(group=sub)


# The default group must still work after the subgroup was used by only some ranks.
@group("default group after subgroup")
def _():
    key = "after-sub/allreduce"
    t = make_input(RANK, key, (N,), F64)
    UT.all_reduce(t, R.SUM, "SUM")
    check(key, t, ref_reduce(all_inputs(key, (N,), F64), "SUM", F64), exact=False)


# Last, because on a backend that serialises point-to-point operations per communicator (as one
# NCCL communicator does) these can deadlock, and a hang ends the test: with irecv posted to BOTH
# neighbours before any isend, each rank waits on a neighbour that is itself waiting.  gloo (and
# torch's NCCL backend, which gives each peer pair its own communicator) completes them, and torch
# code posts receives first all the time, so a torch backend must too.
@group("isend/irecv ring (both directions)")
def _():
    for dt in DTYPES:
        key = "iring/%s" % dname(dt)
        with guard(key):
            nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
            a = torch.zeros(N, dtype=dt)
            b = torch.zeros(N, dtype=dt)
            ws_ = [dist.irecv(a, prv), dist.irecv(b, nxt),
                   dist.isend(make_input(RANK, key + "/fwd", (N,), dt), nxt),
                   dist.isend(make_input(RANK, key + "/bwd", (N,), dt), prv)]
            for w in ws_:
                w.wait()
            check(key + "/from-prev", a, make_input(prv, key + "/fwd", (N,), dt))
            check(key + "/from-next", b, make_input(nxt, key + "/bwd", (N,), dt))


@group("isend/irecv (irecv posted before isend)")
def _():
    kp = "p2p/irecv-first"
    r_ = torch.zeros(N, dtype=F32)
    wr = dist.irecv(r_, (RANK - 1) % WS)
    ws_ = dist.isend(make_input(RANK, kp, (N,), F32), (RANK + 1) % WS)
    ws_.wait()
    wr.wait()
    check(kp, r_, make_input((RANK - 1) % WS, kp, (N,), F32))



dist.barrier(group=GLOO)
if S.failed:
    print("collectives test: %d checks FAILED on rank %d (%d passed; backend under test %s)" %
          (len(S.failed), RANK, S.passed, UT_NAME), flush=True)
    sys.stdout.flush()
    os._exit(1)
refs = ", ".join("%s %d" % kv for kv in sorted(S.by_ref.items()))
print("collectives test: %d checks passed on rank %d (backend under test %s, world %d; compared against: %s)" %
      (S.passed, RANK, UT_NAME, WS, refs), flush=True)
dist.destroy_process_group()
