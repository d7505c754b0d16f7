# SPDX-License-Identifier: Apache-2.0
"""chorus_torch.ep.Buffer (DeepEP's dispatch and combine) on the default "chorus" group.

Run under torchrun (run_torch_tests.sh runs it with 2 and 4 ranks). Every rank regenerates every
rank's inputs from seeds (random non-integer tokens, distinct experts per token with some slots
-1, a token with no expert at all, rank 1 without tokens) and checks its own results against a
reference computed from them:
  - get_dispatch_layout equals the counts of topk_idx;
  - dispatch of FP32, BF16 and FP8 tuples: the rows that arrive are the tokens with an expert
    here, bit for bit, by source rank then token; topk indices local (-1 elsewhere), weights 0
    elsewhere, per-expert counts rounded up to expert_alignment;
  - combine (BF16 after FP8) of rows each rank derives from what it received: each token gets
    the float sum of its ranks' rows in ascending rank order, rounded once (<chorus/ep.h>), bit
    for bit, and the topk weights sent back add up to the original ones (0 in -1 slots);
  - bad input raises with a message: an expert index out of range on one rank raises on every
    rank (naming the token there, the rank elsewhere); a wrong dtype or shape, a cached-dispatch
    handle, a previous_event that is not an EventOverlap, a destroyed Buffer raise locally; a
    too-small buffer names the size hint;
  - dispatch and combine with async_finish=True (BF16, FP8): EventOverlap events, the combine
    queued behind the dispatch's event, the same checks once the events are waited for;
  - the Buffer and the group work afterwards, an all_reduce of the group running beside a dispatch;
  - low-latency mode on a Buffer sized by get_low_latency_rdma_size_hint: low_latency_dispatch of
    BF16 and FP32 rows (bit for bit) and FP8 (float, round_scale and UE8M0 scales exactly as
    <chorus/ep.h> derives them, values within E4M3's bound), recv_count and the rows of each local
    expert in the promised order (source rank, then token), then low_latency_combine of rows
    derived from each row's token and expert (NaN in unused rows) against <chorus/ep.h>'s weighted
    sum, bit for bit; return_recv_hook off and on (a hook called twice, a hook dropped uncalled,
    cumulative_local_expert_recv_stats added to once the data is valid),
    two micro-batches in flight (dispatch A, dispatch B, hook A, hook B; the same for combine), a
    third call refused, a combine before its dispatch hook refused, an expert index out of range on
    rank 0 (raising on every rank, naming the index there), local argument checks, and a hook
    outliving its destroyed Buffer.
Prints "ep test: OK on rank R"; exits non-zero on a failure. Chorus only.
"""
import sys
import time

import torch
import torch.distributed as dist

import torch_test_common as common

HIDDEN = 256  # FP8 needs a multiple of 128
TOPK = 4
TOKENS = [13, 0, 29, 6]  # per rank (rank 1 has none); more ranks repeat it


def num_tokens(rank):
    return TOKENS[rank % len(TOKENS)]


def inputs(rank, num_experts, case):
    """Rank `rank`'s tokens for `case`: x float32, topk_idx, topk_weights; the same on every rank."""
    g = torch.Generator().manual_seed(1000 * case + rank)
    n = num_tokens(rank)
    x = torch.randn(n, HIDDEN, generator=g) * 3.7
    idx = torch.stack([torch.randperm(num_experts, generator=g)[:TOPK] for _ in range(n)]) \
        if n else torch.empty(0, TOPK, dtype=torch.long)
    idx[torch.rand(n, TOPK, generator=g) < 0.25] = -1
    if n:
        idx[0] = -1  # a token that goes nowhere
    weights = torch.rand(n, TOPK, generator=g) + 0.1
    return x, idx, weights


def fp8_inputs(rank, case):
    """FP8 tokens: E4M3 codes (NaN codes 0x7f / 0xff avoided) and one scale per 128 channels."""
    g = torch.Generator().manual_seed(5000 * case + rank)
    n = num_tokens(rank)
    codes = torch.randint(0, 127, (n, HIDDEN), generator=g, dtype=torch.uint8)
    codes |= (torch.rand(n, HIDDEN, generator=g) < 0.5).to(torch.uint8) << 7
    scales = torch.rand(n, HIDDEN // 128, generator=g) + 0.01
    return codes, scales


def expected_dispatch(rank, world, num_experts, all_idx, all_w):
    """(source rank, token) of each row arriving here in order, its local indices and weights."""
    local = num_experts // world
    lo, hi = rank * local, (rank + 1) * local
    rows, idx, w = [], [], []
    for src in range(world):
        for t in range(all_idx[src].shape[0]):
            here = (all_idx[src][t] >= lo) & (all_idx[src][t] < hi)
            if here.any():
                rows.append((src, t))
                idx.append(torch.where(here, all_idx[src][t] - lo, torch.full_like(here, -1, dtype=torch.long)))
                w.append(torch.where(here, all_w[src][t], torch.zeros(())))
    return rows, (torch.stack(idx) if idx else torch.empty(0, TOPK, dtype=torch.long)), \
        (torch.stack(w) if w else torch.empty(0, TOPK))


def expert_rows(x, dst, dtype):
    """What rank dst returns for received rows x: a function of the rows and of dst."""
    return (x.float() * (0.5 + dst)).to(dtype)


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.checks = 0

    def equal(self, what, got, want):
        self.checks += 1
        if got is None or want is None:
            ok = got is None and want is None
        elif isinstance(want, torch.Tensor):
            ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        else:
            ok = got == want
        if not ok:
            self.failures.append(f"{what}: got {got}, want {want}")

    def raises(self, what, kinds, needles, fn):
        """fn() must raise one of kinds with one of `needles` (a string or a tuple) in its message."""
        self.checks += 1
        needles = (needles,) if isinstance(needles, str) else needles
        try:
            fn()
        except kinds as e:
            if not any(n in str(e) for n in needles):
                self.failures.append(f"{what}: message {str(e)!r} lacks {' or '.join(needles)!r}")
            return
        except Exception as e:  # noqa: BLE001 - any other kind is a failure, reported
            self.failures.append(f"{what}: raised {type(e).__name__}: {e}")
            return
        self.failures.append(f"{what}: did not raise")


def round_trip(buf, ck, world, num_experts, dtype, case, alignment, queued=False):
    """Dispatch every rank's tokens (dtype, or FP8 tuples for torch.uint8) and combine rows back;
    `queued`: with async_finish, the outputs checked after the events are waited for."""
    from chorus_torch.ep import EventOverlap
    rank = buf.rank
    all_in = [inputs(r, num_experts, case) for r in range(world)]
    x, idx, w = all_in[rank]
    all_idx = [a[1] for a in all_in]
    all_w = [a[2] for a in all_in]
    common.CURRENT[0] = f"{dtype} dispatch, case {case}{' (async_finish)' if queued else ''}"
    per_rank, rdma, per_expert, in_rank, event = buf.get_dispatch_layout(idx, num_experts)
    local = num_experts // world
    routed = [(idx >= r * local) & (idx < (r + 1) * local) for r in range(world)]
    ck.equal("layout: is_token_in_rank", in_rank,
             torch.stack([m.any(1) for m in routed], 1) if idx.shape[0] else torch.empty(0, world, dtype=torch.bool))
    ck.equal("layout: num_tokens_per_rank", per_rank,
             torch.tensor([int(m.any(1).sum()) for m in routed], dtype=torch.int32))
    ck.equal("layout: num_tokens_per_expert", per_expert,
             torch.tensor([int((idx == e).sum()) for e in range(num_experts)], dtype=torch.int32))
    ck.equal("layout: RDMA counts and event", (rdma, event), (None, None))

    fp8 = dtype == torch.uint8
    if fp8:
        all_fp8 = [fp8_inputs(r, case) for r in range(world)]
        sent = all_fp8[rank]
    else:
        sent = x.to(dtype)
    recv_x, recv_idx, recv_w, recv_per_expert, handle, event = buf.dispatch(
        sent, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, expert_alignment=alignment,
        async_finish=queued)
    dispatched = event
    if queued:
        ck.equal(f"{dtype}: dispatch event type", type(event), EventOverlap)
        with event:
            pass  # (computation to overlap would go here)
        ck.equal(f"{dtype}: dispatch event done", event.done(), True)
        event = None
    rows, want_idx, want_w = expected_dispatch(rank, world, num_experts, all_idx, all_w)
    if fp8:
        want_codes = torch.stack([all_fp8[s][0][t] for s, t in rows]) if rows else torch.empty(0, HIDDEN, dtype=torch.uint8)
        want_scales = torch.stack([all_fp8[s][1][t] for s, t in rows]) if rows else torch.empty(0, HIDDEN // 128)
        ck.equal(f"{dtype}: recv_x codes", recv_x[0], want_codes)
        ck.equal(f"{dtype}: recv_x scales", recv_x[1], want_scales)
    else:
        want_x = torch.stack([all_in[s][0][t] for s, t in rows]).to(dtype) if rows else torch.empty(0, HIDDEN, dtype=dtype)
        ck.equal(f"{dtype}: recv_x", recv_x, want_x)
    ck.equal(f"{dtype}: recv_topk_idx", recv_idx, want_idx)
    ck.equal(f"{dtype}: recv_topk_weights", recv_w, want_w)
    counts = [int((want_idx == e).sum()) for e in range(local)]
    ck.equal(f"{dtype}: num_recv_tokens_per_expert_list", recv_per_expert,
             [(c + alignment - 1) // alignment * alignment for c in counts])
    ck.equal(f"{dtype}: dispatch event, handle sizes", (event, handle.num_tokens, handle.num_recv_tokens),
             (None, idx.shape[0], len(rows)))

    # Combine rows derived from the received tokens (after an FP8 dispatch, BF16 rows of the
    # scales); the source derives the same from its own tokens.
    common.CURRENT[0] = f"{dtype} combine, case {case}"
    out_dtype = torch.bfloat16 if fp8 else dtype

    def rows_of(tokens):
        return tokens[1].repeat_interleave(128, dim=1).to(out_dtype) if fp8 else tokens

    y = expert_rows(rows_of(recv_x), rank, out_dtype)
    combined, combined_w, event = buf.combine(y, handle, topk_weights=recv_w, async_finish=queued,
                                              previous_event=dispatched)
    if queued:
        ck.equal(f"{dtype}: combine event type", type(event), EventOverlap)
        event.current_stream_wait()
        event = None
    # At this rank: each token's rows from the ranks it went to, float sum in rank order, one rounding.
    want = torch.zeros(idx.shape[0], HIDDEN)
    for dst in range(world):
        went = routed[dst].any(1)
        want[went] += expert_rows(rows_of(sent)[went], dst, out_dtype).float()
    ck.equal(f"{dtype}: combined_x", combined, want.to(out_dtype))
    ck.equal(f"{dtype}: combined_topk_weights", combined_w, torch.where(idx >= 0, w, torch.zeros(())))
    ck.equal(f"{dtype}: combine event", event, None)
    # Without weights, and a second time on the same handle.
    combined2, no_w, _ = buf.combine(y, handle)
    ck.equal(f"{dtype}: combine again, no weights", (torch.equal(combined2, combined), no_w), (True, None))


def bad_inputs(buf, ck, world, num_experts):
    from chorus_torch.ep import Buffer
    rank = buf.rank
    x, idx, w = inputs(rank, num_experts, 7)
    layout = buf.get_dispatch_layout(idx, num_experts)
    kw = dict(num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
              num_tokens_per_expert=layout[2], topk_idx=idx, topk_weights=w)

    common.CURRENT[0] = "expert index out of range on rank 0"
    bad_idx = idx.clone()
    if rank == 0:
        bad_idx[0, 1] = num_experts  # token 0, slot 1
    needle = "token 0" if rank == 0 else "rank(s) 0"
    ck.raises("expert out of range (dispatch)", RuntimeError, needle,
              lambda: buf.dispatch(x, **dict(kw, topk_idx=bad_idx)))
    if rank == 0:
        ck.raises("expert out of range (layout)", RuntimeError, "token 0",
                  lambda: buf.get_dispatch_layout(bad_idx, num_experts))

    common.CURRENT[0] = "local argument checks"
    ck.raises("float64 x", TypeError, "float32 or bfloat16", lambda: buf.dispatch(x.double(), **kw))
    ck.raises("int32 topk_idx", TypeError, "topk_idx", lambda: buf.dispatch(x, **dict(kw, topk_idx=idx.int())))
    ck.raises("short topk_weights", ValueError, "topk_weights must have shape",
              lambda: buf.dispatch(x, **dict(kw, topk_weights=w[:, :2].contiguous())))
    ck.raises("non-contiguous x", ValueError, "contiguous",
              lambda: buf.dispatch(torch.randn(HIDDEN, 2).t(), **kw))
    ck.raises("FP8 scales of float64", TypeError, "scales",
              lambda: buf.dispatch((x.to(torch.uint8), torch.ones(x.shape[0], HIDDEN // 128).double()), **kw))
    ck.raises("cached dispatch", NotImplementedError, "cached dispatch", lambda: buf.dispatch(x, handle=object(), **kw))
    ck.raises("previous_event of another kind", TypeError, "EventOverlap",
              lambda: buf.dispatch(x, previous_event=object(), **kw))
    _, _, _, _, handle, _ = buf.dispatch(x, **kw)
    ck.raises("combine of wrong rows", ValueError, "x must have shape",
              lambda: buf.combine(torch.zeros(handle.num_recv_tokens + 1, HIDDEN), handle))

    common.CURRENT[0] = "a buffer too small"
    # Rank 0 sends 13 tokens of 1072 bytes: more than 4096 bytes; other ranks may fit.
    with Buffer(None, 4096) as small:
        ck.raises("too small a buffer", RuntimeError,
                  "chorusEpBufferSizeHint" if rank == 0 else ("chorusEpBufferSizeHint", "rank(s) 0"),
                  lambda: small.dispatch(x, **kw))
    ck.raises("destroyed buffer", ValueError, "destroyed", lambda: small.dispatch(x, **kw))


# ---- Low-latency mode (low_latency_dispatch / low_latency_combine) ----

LL_MAX_TOKENS = 32  # num_max_dispatch_tokens_per_rank: >= every rank's tokens


def e4m3_table():
    """The value of each E4M3 (fn) byte, float64; NaN for 0x7f and 0xff."""
    vals = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            vals.append(float("nan"))
        elif exp == 0:
            vals.append(sign * man / 8 * 2.0 ** -6)
        else:
            vals.append(sign * (1 + man / 8) * 2.0 ** (exp - 7))
    return torch.tensor(vals, dtype=torch.float64)


E4M3 = e4m3_table()
FLT_MIN = 2.0 ** -126


def ll_inputs(rank, num_experts, case, dtype):
    """inputs(), x in `dtype`, with an all-zero 128-channel block in token 1 (FP8's FLT_MIN scale)."""
    x, idx, w = inputs(rank, num_experts, 100 + case)
    if x.shape[0] > 1:
        x[1, 128:256] = 0
    return x.to(dtype), idx, w


def ll_routes(rank, world, num_experts, all_idx):
    """Per local expert of `rank`: the (source rank, token) of each row, in the promised order."""
    local = num_experts // world
    return [[(src, t) for src in range(world) for t in range(all_idx[src].shape[0])
             if bool((all_idx[src][t] == rank * local + e).any())] for e in range(local)]


def ll_expert_row(x_row, expert, dtype):
    """What expert `expert` returns for a token: a function of the token and the expert."""
    return (x_row.float() * (0.5 + 0.25 * expert)).to(dtype)


def expected_scales(x, round_scale):
    """Float64 scale per 128-channel block of x [tokens, hidden] (<chorus/ep.h>'s FP8 rule)."""
    amax = x.float().reshape(x.shape[0], HIDDEN // 128, 128).abs().amax(dim=2)
    if not round_scale:
        return torch.clamp(amax / 448, min=FLT_MIN).double()
    out = torch.empty(amax.shape, dtype=torch.float64)
    for i, a in enumerate(amax.double().flatten().tolist()):
        e = -127
        while e < 127 and a > 448 * 2.0 ** e:
            e += 1
        out.view(-1)[i] = 2.0 ** e
    return out


def check_ll_dispatch(ck, what, world, num_experts, all_x, all_idx, got, use_fp8, round_scale, use_ue8m0):
    """recv_x / recv_count of this rank against every rank's inputs."""
    from chorus_torch.ep import FP8_DTYPE
    rank = dist.get_rank()
    recv_x, recv_count = got
    routes = ll_routes(rank, world, num_experts, all_idx)
    local, rows = num_experts // world, world * LL_MAX_TOKENS
    ck.equal(f"{what}: recv_count", recv_count, torch.tensor([len(r) for r in routes], dtype=torch.int32))
    if not use_fp8:
        ck.equal(f"{what}: recv_x shape, dtype", (tuple(recv_x.shape), recv_x.dtype),
                 ((local, rows, HIDDEN), all_x[0].dtype))
        for e, r in enumerate(routes):
            want = torch.stack([all_x[s][t] for s, t in r]) if r else torch.empty(0, HIDDEN, dtype=all_x[0].dtype)
            ck.equal(f"{what}: recv_x[{e}] rows", recv_x[e, :len(r)], want)
        return
    codes, scales = recv_x
    ck.equal(f"{what}: codes and scales shapes, dtypes",
             (tuple(codes.shape), codes.dtype, tuple(scales.shape), scales.dtype),
             ((local, rows, HIDDEN), FP8_DTYPE, (local, rows, HIDDEN // 128),
              torch.uint8 if use_ue8m0 else torch.float32))
    all_s = [expected_scales(x, round_scale or use_ue8m0) for x in all_x]
    for e, r in enumerate(routes):
        if not r:
            continue
        x = torch.stack([all_x[s][t] for s, t in r]).double()
        want_s = torch.stack([all_s[s][t] for s, t in r])
        got_s = scales[e, :len(r)]
        got_s = torch.pow(2.0, got_s.double() - 127) if use_ue8m0 else got_s.double()
        ck.equal(f"{what}: scales of expert {e}", got_s, want_s)
        # Decoded within E4M3's bound: |x' - x| <= (2^-4 + 2^-20) |x| + 2^-10 s + 2^-149.
        s = want_s.repeat_interleave(128, dim=1)
        decoded = E4M3[codes[e, :len(r)].view(torch.uint8).long()] * s
        bound = (2.0 ** -4 + 2.0 ** -20) * x.abs() + 2.0 ** -10 * s + 2.0 ** -149
        err = (decoded - x).abs()
        ck.checks += 1
        if not bool((err <= bound).all()):
            worst = int((err - bound).argmax())
            ck.failures.append(f"{what}: expert {e}: FP8 value {float(decoded.view(-1)[worst])} "
                               f"for {float(x.view(-1)[worst])} is outside E4M3's bound {float(bound.view(-1)[worst])}")


def ll_expert_outputs(world, num_experts, all_x, all_idx, dtype):
    """This rank's combine input [L, R, hidden]: each received row's expert output, NaN elsewhere
    (rows combine must not read)."""
    rank = dist.get_rank()
    local = num_experts // world
    y = torch.full((local, world * LL_MAX_TOKENS, HIDDEN), float("nan"), dtype=dtype)
    for e, r in enumerate(ll_routes(rank, world, num_experts, all_idx)):
        for j, (s, t) in enumerate(r):
            y[e, j] = ll_expert_row(all_x[s][t], rank * local + e, dtype)
    return y


def ll_combined(x, idx, w, dtype):
    """<chorus/ep.h>'s combine for this rank's tokens: acc = acc + fl(w * row) per slot in order,
    in float, rounded once to dtype."""
    out = torch.zeros(x.shape[0], HIDDEN)
    for t in range(x.shape[0]):
        acc = torch.zeros(HIDDEN)
        for k in range(idx.shape[1]):
            if int(idx[t, k]) >= 0:
                acc = acc + w[t, k] * ll_expert_row(x[t], int(idx[t, k]), dtype).float()
        out[t] = acc
    return out.to(dtype)


class LowLatencyCase:
    """One low-latency dispatch + combine of every rank's tokens, started and checked in steps so
    that two can be in flight."""

    def __init__(self, buf, ck, world, num_experts, case, dtype, use_fp8=False, round_scale=False,
                 use_ue8m0=False, combine_dtype=torch.bfloat16):
        self.buf, self.ck, self.world, self.num_experts = buf, ck, world, num_experts
        self.flags = dict(use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0)
        self.combine_dtype = combine_dtype
        self.what = (f"low-latency case {case} ({dtype}, fp8={use_fp8}, round_scale={round_scale}, "
                     f"ue8m0={use_ue8m0}, combine {combine_dtype})")
        all_in = [ll_inputs(r, num_experts, case, dtype) for r in range(world)]
        self.all_x = [a[0] for a in all_in]
        self.all_idx = [a[1] for a in all_in]
        self.x, self.idx, self.w = all_in[buf.rank]

    def dispatch(self, hook, stats=None):
        common.CURRENT[0] = self.what + " dispatch"
        self.recv_x, self.recv_count, self.handle, event, self.hook = self.buf.low_latency_dispatch(
            self.x, self.idx, LL_MAX_TOKENS, self.num_experts, cumulative_local_expert_recv_stats=stats,
            return_recv_hook=hook, **self.flags)
        self.ck.equal(f"{self.what}: dispatch event, hook", (event, self.hook is None), (None, not hook))
        if hook:
            self.ck.equal(f"{self.what}: dispatch hook pending", self.hook.done, False)

    def run_hook(self):
        self.hook()
        self.ck.equal(f"{self.what}: hook done", self.hook.done, True)
        self.hook()  # a second call does nothing
        self.hook = None

    def check_dispatch(self):
        check_ll_dispatch(self.ck, self.what, self.world, self.num_experts, self.all_x, self.all_idx,
                          (self.recv_x, self.recv_count), **self.flags)

    def combine(self, hook, out=None):
        common.CURRENT[0] = self.what + " combine"
        y = ll_expert_outputs(self.world, self.num_experts, self.all_x, self.all_idx, self.combine_dtype)
        self.combined, event, self.hook = self.buf.low_latency_combine(
            y, self.idx, self.w, self.handle, return_recv_hook=hook, out=out)
        self.ck.equal(f"{self.what}: combine event, hook", (event, self.hook is None), (None, not hook))
        if out is not None:
            self.ck.equal(f"{self.what}: combine wrote into out", self.combined is out, True)

    def check_combine(self):
        self.ck.equal(f"{self.what}: combined_x", self.combined,
                      ll_combined(self.x, self.idx, self.w, self.combine_dtype))

    def run(self, hook, stats=None):
        """Dispatch (adding to stats, DeepEP's cumulative_local_expert_recv_stats, when given) and
        combine, one call in flight."""
        before = None if stats is None else stats.clone()
        self.dispatch(hook, stats)
        if hook:
            if stats is not None:
                self.ck.equal(f"{self.what}: stats before the hook", stats, before)
            self.run_hook()
        if stats is not None:
            self.ck.equal(f"{self.what}: stats += recv_count (once)", stats, before + self.recv_count)
        self.check_dispatch()
        self.combine(hook)
        if hook:
            self.run_hook()
        self.check_combine()


def low_latency(ck, world, num_experts):
    from chorus_torch.ep import Buffer
    rank = dist.get_rank()
    hint = Buffer.get_low_latency_rdma_size_hint(LL_MAX_TOKENS, HIDDEN, world, num_experts, TOPK)
    ck.equal("LL size hint without topk covers topk", Buffer.get_low_latency_rdma_size_hint(
        LL_MAX_TOKENS, HIDDEN, world, num_experts) >= hint, True)
    buf = Buffer(None, 0, hint, low_latency_mode=True)
    ck.equal("LL buffer attributes", (buf.num_bytes, buf.low_latency_mode), (hint, True))

    def case(n, dtype, **kw):
        return LowLatencyCase(buf, ck, world, num_experts, n, dtype, **kw)

    # One call in flight, hooks off and on; BF16 and FP32 exact, FP8 within E4M3's bound.
    stats = torch.full((num_experts // world,), 5, dtype=torch.int32)
    case(0, torch.bfloat16).run(hook=False, stats=stats)
    case(1, torch.float32, combine_dtype=torch.float32).run(hook=True)
    case(2, torch.bfloat16, use_fp8=True).run(hook=False)
    case(3, torch.bfloat16, use_fp8=True, round_scale=True).run(hook=True, stats=stats)
    case(4, torch.float32, use_fp8=True, use_ue8m0=True, combine_dtype=torch.float32).run(hook=False)

    # A hook never called: dropped, it waits and frees its slot (two calls fit in flight below).
    dropped = case(5, torch.bfloat16)
    dropped.dispatch(hook=True)
    dropped.hook = None
    dropped.check_dispatch()  # the dropped hook wrote the outputs it kept alive
    # Outputs dropped before their hook runs: the hook keeps them until it has written them.
    orphan = case(11, torch.float32, use_fp8=True)
    orphan.dispatch(hook=True)
    del orphan.recv_x, orphan.recv_count
    orphan.run_hook()

    # Two micro-batches in flight: dispatch A, dispatch B, hook A, hook B; likewise for combine.
    a = case(6, torch.bfloat16, use_fp8=True)
    b = case(7, torch.bfloat16)
    a.dispatch(hook=True)
    b.dispatch(hook=True)
    common.CURRENT[0] = "a third low-latency call in flight"
    ck.raises("third call in flight", RuntimeError, ("in flight", "rank(s)"),
              lambda: buf.low_latency_dispatch(a.x, a.idx, LL_MAX_TOKENS, num_experts, use_fp8=False))
    common.CURRENT[0] = "combine before its dispatch hook ran"
    ck.raises("combine before the dispatch hook", RuntimeError, ("hook has not been waited", "rank(s)"),
              lambda: buf.low_latency_combine(
                  ll_expert_outputs(world, num_experts, a.all_x, a.all_idx, torch.bfloat16), a.idx, a.w, a.handle))
    a.run_hook()
    b.run_hook()
    a.check_dispatch()
    b.check_dispatch()
    out = torch.empty(a.x.shape[0], HIDDEN, dtype=torch.bfloat16)
    a.combine(hook=True, out=out)
    b.combine(hook=True)
    a.run_hook()
    b.run_hook()
    a.check_combine()
    b.check_combine()

    # Bad input: an expert index out of range on rank 0 raises on every rank, naming it there.
    common.CURRENT[0] = "low-latency expert index out of range on rank 0"
    bad = case(8, torch.bfloat16)
    bad_idx = bad.idx.clone()
    if rank == 0:
        bad_idx[0, 1] = num_experts  # token 0, slot 1
    needle = f"expert index {num_experts}" if rank == 0 else "rank(s) 0"
    ck.raises("LL expert out of range", RuntimeError, needle,
              lambda: buf.low_latency_dispatch(bad.x, bad_idx, LL_MAX_TOKENS, num_experts, use_fp8=False))
    common.CURRENT[0] = "low-latency local argument checks"
    ck.raises("LL float64 x", TypeError, "bfloat16 or float32",
              lambda: buf.low_latency_dispatch(bad.x.double(), bad.idx, LL_MAX_TOKENS, num_experts))
    ck.raises("LL async_finish", NotImplementedError, "return_recv_hook",
              lambda: buf.low_latency_dispatch(bad.x, bad.idx, LL_MAX_TOKENS, num_experts, async_finish=True))
    bad.dispatch(hook=False)  # the buffer works after the refusal
    bad.check_dispatch()
    y = ll_expert_outputs(world, num_experts, bad.all_x, bad.all_idx, torch.bfloat16)
    if bad.idx.shape[0]:  # (with no tokens, any topk_idx of the shape is the dispatch's)
        ck.raises("LL combine with another topk_idx", ValueError, "differs from the dispatch",
                  lambda: buf.low_latency_combine(y, torch.full_like(bad.idx, -1), bad.w, bad.handle))
    ck.raises("LL combine of wrong x shape", ValueError, "x must have shape",
              lambda: buf.low_latency_combine(y[:, 1:].contiguous(), bad.idx, bad.w, bad.handle))
    bad.combine(hook=False)
    bad.check_combine()
    buf.destroy()

    # A buffer destroyed with a hook pending: the hook still completes (and frees the buffer's
    # communicator); a second one, never called, is waited for when dropped.
    common.CURRENT[0] = "a hook outliving its Buffer"
    with Buffer(None, 0, hint, low_latency_mode=True) as buf2:
        late = LowLatencyCase(buf2, ck, world, num_experts, 9, torch.bfloat16)
        late.dispatch(hook=True)
        never = LowLatencyCase(buf2, ck, world, num_experts, 10, torch.bfloat16)
        never.dispatch(hook=True)
    late.run_hook()
    late.check_dispatch()
    never.hook = None
    never.check_dispatch()
    ck.raises("LL call on a destroyed buffer", ValueError, "destroyed",
              lambda: buf2.low_latency_dispatch(late.x, late.idx, LL_MAX_TOKENS, num_experts))


def main():
    args = common.parse_args(__doc__)
    if args.backend_under_test != "chorus":
        print("ep test: skipped (chorus_torch.ep needs the chorus backend)")
        return 0
    common.import_backend(args)
    from chorus_torch.ep import Buffer
    common.init_default_group(args, timeout_s=30)
    common.start_watchdog(args.watchdog_s, "ep test")
    rank, world = dist.get_rank(), dist.get_world_size()
    start = time.monotonic()
    num_experts = 3 * world
    ck = Checker(rank)

    size = Buffer.get_buffer_size_hint(world, max(TOKENS), HIDDEN, TOPK)
    buf = Buffer(None, num_nvl_bytes=size)
    ck.equal("buffer attributes", (buf.rank, buf.num_ranks, buf.num_bytes), (rank, world, size))
    for case, (dtype, alignment) in enumerate([(torch.float32, 1), (torch.bfloat16, 4), (torch.uint8, 2)]):
        round_trip(buf, ck, world, num_experts, dtype, case, alignment)
    for case, (dtype, alignment) in enumerate([(torch.bfloat16, 2), (torch.uint8, 1)], start=3):
        round_trip(buf, ck, world, num_experts, dtype, case, alignment, queued=True)
    bad_inputs(buf, ck, world, num_experts)

    # The buffer's communicator is its own: EP calls run while the group's lane runs a collective.
    common.CURRENT[0] = "after the errors, with an all_reduce in flight"
    t = torch.full((1 << 16,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    round_trip(buf, ck, world, num_experts, torch.float32, 9, 1)
    work.wait()
    ck.equal("all_reduce beside the EP calls", t, torch.full((1 << 16,), float(world * (world + 1) // 2)))
    buf.destroy()

    try:
        low_latency(ck, world, num_experts)
    finally:  # the failures so far, also when a call raised
        for f in ck.failures:
            print(f"[rank {rank}] FAIL {f}", flush=True)
    if not ck.failures:
        print(f"ep test: OK on rank {rank} ({ck.checks} checks, {world} ranks, "
              f"{time.monotonic() - start:.1f} s after the group's start)", flush=True)
    dist.destroy_process_group()
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
