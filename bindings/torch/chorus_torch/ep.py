# SPDX-License-Identifier: Apache-2.0
"""MoE expert parallelism on a "chorus" group: DeepEP's V1 Buffer on CPU tensors, normal mode and
low-latency mode.

    from chorus_torch.ep import Buffer
    buf = Buffer(group, Buffer.get_buffer_size_hint(group.size(), max_tokens, hidden, topk))
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_idx, recv_w, recv_per_expert, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
    # ... expert outputs, weighted by recv_w and summed per received token: y ...
    combined_x, combined_w, _ = buf.combine(y, handle, topk_weights=recv_w)

Low-latency mode (decoding: at most num_max_dispatch_tokens_per_rank tokens per rank, outputs
laid out per local expert in fixed-size arrays):

    buf = Buffer(group, 0, Buffer.get_low_latency_rdma_size_hint(
        max_tokens, hidden, group.size(), num_experts, topk), low_latency_mode=True)
    recv_x, recv_count, handle, _, hook = buf.low_latency_dispatch(
        x, topk_idx, max_tokens, num_experts, use_fp8=False, return_recv_hook=True)
    # ... other work while the tokens move ...
    hook()  # now recv_x and recv_count hold the data
    # expert e's outputs for its rows recv_x[e, :recv_count[e]] in the same rows of y
    combined_x, _, _ = buf.low_latency_combine(y, topk_idx, topk_weights, handle)

The methods, arguments and results are DeepEP's, with <chorus/ep.h>'s semantics (the routing,
ordering and summation rules are written there). Differences, all deliberate:
  - Events and streams: dispatch and combine with async_finish=True queue their data movement
    on the buffer's host stream (chorusEpDispatchAsync / chorusEpCombineAsync) and return an
    EventOverlap: the call itself routes, exchanges the counts and checks the arguments (so
    errors raise at once, and recv_x's size and num_recv_tokens_per_expert_list are known),
    while the tokens move, are unpacked and reduced in the background; event.current_stream_wait()
    (or leaving a `with event:` block) waits until the outputs are written. Until then the
    call's tensors must not be touched (the buffer keeps them alive). previous_event (an
    EventOverlap of this module) makes the call's queued work wait for that event. Without
    async_finish the calls are blocking and the events None. The next call on a buffer first
    waits for the previous call's queued work (one call at a time per buffer), so a combine may
    follow an asynchronous dispatch at once. get_dispatch_layout is computed in the call (its
    event, with async_finish, is already complete). Low-latency calls overlap through
    return_recv_hook, as in DeepEP; their async_finish is refused. allocate_on_comm_stream and
    config are accepted and ignored.
  - FP8: torch 1.13 has no float8 dtype, so an FP8 x is a tuple (uint8 tensor of E4M3 codes
    [tokens, hidden], float32 scales [tokens, hidden / 128]); recv_x is such a tuple too. The
    low-latency dispatch's FP8 codes are torch.float8_e4m3fn where this torch has that dtype,
    uint8 codes otherwise (torch 1.13).
  - topk_idx (int64) is required: the routing comes from it. num_tokens_per_rank,
    is_token_in_rank and num_tokens_per_expert (get_dispatch_layout's) are required as in
    DeepEP; the C API checks them against topk_idx.
  - Cached dispatch (handle=..., DeepEP's layout reuse) is refused: the C API routes every
    dispatch afresh and has no entry point that reuses a handle's routing.
  - Output size: recv_x has exactly the rows that arrive. As in DeepEP, the outputs are
    allocated after the dispatch's own count exchange (the C API's allocate callback), so they
    need no worst-case capacity (num_ranks x max_tokens rows) and no extra collective.
    num_worst_tokens (DeepEP's padded outputs) is not supported.
  - Low-latency mode: see low_latency_dispatch and low_latency_combine (UE8M0 scales one byte
    per 128 channels, not packed; rows ordered by source rank and token, not by arrival; the
    handle is opaque; no LogFMT, zero-copy or wait-cost statistics).
  - Tensors: CPU and contiguous; a wrong dtype (TypeError), device, memory layout or shape
    (ValueError) raises on the calling rank before any communication. Errors of the C API
    (expert indices outside [-1, num_experts), sizes, arguments that differ between ranks) raise
    RuntimeError with Chorus's message on every rank, and the buffer and group stay usable.
  - Communicator: the buffer has its own, split from the group's when the Buffer is made (so
    making a Buffer is collective over the group, in order with its other operations); its
    calls are blocking collectives on the calling thread, which the group's own communicator,
    driven by the group's threads, cannot carry. Every rank calls dispatch and combine the same
    number of times in the same order; one thread at a time per Buffer.
"""
from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import _C
from ._C import ProcessGroupChorus

Tokens = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]

# The dtype of the low-latency dispatch's FP8 codes: float8_e4m3fn where torch has it (2.1 and
# later), else the codes' bytes as uint8 (torch 1.13).
FP8_DTYPE = getattr(torch, "float8_e4m3fn", torch.uint8)

# The largest topk of <chorus/ep.h>.
MAX_TOPK = 1024


class EventOverlap:
    """DeepEP's EventOverlap for an asynchronous call (async_finish=True) on a host stream.

    current_stream_wait() blocks until the call's queued work is done (its outputs written) and
    raises its failure; `with event:` runs the block, then waits (DeepEP's overlap idiom);
    done() is True once the work is done. An EventOverlap() without an event is complete."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def done(self) -> bool:
        return self.event is None or self.event.query()

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, *exc) -> None:
        self.current_stream_wait()


class Buffer:
    """An EP buffer bound to a "chorus" process group (None: the default group).

    num_bytes: the staging memory, allocated once; DeepEP's num_nvl_bytes is another name for
    it. num_rdma_bytes: the low-latency size (get_low_latency_rdma_size_hint); there is no RDMA
    buffer, so the staging memory is the larger of the two, and one buffer serves both modes
    when each size covers its mode. low_latency_mode is DeepEP's flag, kept as an attribute:
    the low-latency methods work on any Buffer large enough (the C API checks the size).
    destroy() frees it at once; so does leaving a `with Buffer(...)` block, or garbage
    collection. Collective: every rank of the group makes it, in the same order.
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, num_bytes: Optional[int] = None,
                 num_rdma_bytes: int = 0, low_latency_mode: bool = False, *,
                 num_nvl_bytes: Optional[int] = None, explicitly_destroy: bool = False):
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        if not isinstance(group, ProcessGroupChorus):
            raise TypeError(f"chorus Buffer needs a 'chorus' process group, not {type(group).__name__}")
        if num_bytes is not None and num_nvl_bytes is not None and num_bytes != num_nvl_bytes:
            raise ValueError("chorus Buffer: num_bytes and num_nvl_bytes name the same size; pass one")
        size = max(num_bytes or num_nvl_bytes or 0, num_rdma_bytes or 0)
        if not size:
            raise ValueError("chorus Buffer: num_bytes (Buffer.get_buffer_size_hint) or num_rdma_bytes "
                             "(Buffer.get_low_latency_rdma_size_hint) is needed")
        self.group = group
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy  # DeepEP's flag; destroy() works either way
        self._buffer = _C.EpBuffer(group, size)
        self.rank = self._buffer.rank
        self.num_ranks = self._buffer.num_ranks
        self.num_bytes = self._buffer.num_bytes

    @staticmethod
    def get_buffer_size_hint(num_ranks: int, max_tokens: int, hidden: int, topk: int) -> int:
        """Bytes for every dispatch and combine of up to max_tokens tokens per rank."""
        return _C.ep_buffer_size_hint(num_ranks, max_tokens, hidden, topk)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int,
                                       num_ranks: int, num_experts: int,
                                       topk: Optional[int] = None) -> int:
        """Bytes for low-latency calls of up to num_max_dispatch_tokens_per_rank tokens per rank,
        two in flight (chorusEpLowLatencySizeHint); Buffer's num_rdma_bytes.

        Unlike DeepEP's, Chorus's size depends on topk (each token's record carries its topk
        expert indices, and combine stages up to min(topk, local experts) rows per token). topk
        None (DeepEP's four arguments) sizes for the largest topk a token can use without naming
        an expert twice, min(num_experts, 1024): safe for every call that routes without padding
        slots, but often several times the size needed (128 tokens of hidden 7168, 8 ranks, 256
        experts: 3.8 GB, against 0.53 GB with topk 8); pass the model's topk for the exact size.
        The size does not depend on the dtype or on FP8 (it covers float32 tokens)."""
        if topk is None:
            topk = min(num_experts, MAX_TOPK)
        return _C.ep_low_latency_size_hint(num_ranks, num_max_dispatch_tokens_per_rank, hidden,
                                           num_experts, topk)

    def destroy(self) -> None:
        """Frees the staging memory and the buffer's communicator; later calls raise."""
        self._buffer.destroy()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event=None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """(num_tokens_per_rank int32 [num_ranks], None (no RDMA ranks),
        num_tokens_per_expert int32 [num_experts], is_token_in_rank bool [tokens, num_ranks],
        an EventOverlap with async_finish, else None). Local: no communication; computed in the
        call (after previous_event, if given, is complete)."""
        if previous_event is not None:
            _event_of(previous_event).synchronize()
        per_rank, per_expert, in_rank = self._buffer.get_dispatch_layout(topk_idx, num_experts)
        return per_rank, None, per_expert, in_rank, EventOverlap() if async_finish else None

    def dispatch(self, x: Tokens, handle=None, num_tokens_per_rank: Optional[torch.Tensor] = None,
                 num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
                 is_token_in_rank: Optional[torch.Tensor] = None,
                 num_tokens_per_expert: Optional[torch.Tensor] = None,
                 topk_idx: Optional[torch.Tensor] = None,
                 topk_weights: Optional[torch.Tensor] = None, expert_alignment: int = 1,
                 num_worst_tokens: int = 0, config=None, previous_event=None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """Sends each token once to every rank holding one of its experts.

        Returns (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
        handle, None): recv_x [received, hidden] (a tuple for FP8), ordered by source rank then
        source token; recv_topk_idx int64 with local expert indices and -1 for slots elsewhere;
        recv_topk_weights float32 (0 for slots elsewhere; None without topk_weights);
        num_recv_tokens_per_expert_list a list of ints, each rounded up to expert_alignment; the
        last item is an EventOverlap with async_finish (the outputs are written once it is
        waited for), else None. Collective."""
        if handle is not None:
            raise NotImplementedError(
                "chorus dispatch: cached dispatch (handle=...) is not supported: <chorus/ep.h> "
                "routes every dispatch from topk_idx; pass topk_idx and the layout again")
        if num_worst_tokens:
            raise NotImplementedError("chorus dispatch: num_worst_tokens is not supported (outputs "
                                      "always have exactly the rows that arrive)")
        if num_tokens_per_rdma_rank is not None:
            raise ValueError("chorus dispatch: there are no RDMA ranks: num_tokens_per_rdma_rank must be None")
        if topk_idx is None:
            raise ValueError("chorus dispatch: topk_idx is required (the routing comes from it)")
        if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
            raise ValueError("chorus dispatch: pass num_tokens_per_rank, is_token_in_rank and "
                             "num_tokens_per_expert (get_dispatch_layout's)")
        if isinstance(x, tuple):
            if len(x) != 2:
                raise ValueError("chorus dispatch: an FP8 x is a tuple (uint8 codes, float32 scales)")
            x, scales = x
        else:
            scales = None
        recv_x, recv_scales, recv_idx, recv_w, per_expert, h, event = self._buffer.dispatch(
            x, scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
            num_tokens_per_expert, expert_alignment, _event_of(previous_event), async_finish)
        if recv_scales is not None:
            recv_x = (recv_x, recv_scales)
        return recv_x, recv_idx, recv_w, per_expert, h, _overlap(event)

    def combine(self, x: torch.Tensor, handle, topk_weights: Optional[torch.Tensor] = None,
                bias=None, config=None, previous_event=None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False):
        """Returns each token's rows to its source rank and adds them up there.

        x: float32 or bfloat16 [handle.num_recv_tokens, hidden], in recv_x's order.
        Returns (combined_x [tokens, hidden] of x's dtype, combined_topk_weights float32
        [tokens, topk] or None without topk_weights, None): the sums in float, in ascending
        rank order, rounded once (<chorus/ep.h>). The handle may be combined any number of
        times. The last item is an EventOverlap with async_finish, else None. Collective."""
        if bias is not None:
            raise NotImplementedError("chorus combine: bias is not supported")
        if not isinstance(handle, _C.EpHandle):
            raise TypeError(f"chorus combine: handle must be what dispatch returned, not {type(handle).__name__}")
        combined_x, combined_w, event = self._buffer.combine(
            x, handle, topk_weights, _event_of(previous_event), async_finish)
        return combined_x, combined_w, _overlap(event)


    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor,
                             num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                             dispatch_wait_recv_cost_stats: Optional[torch.Tensor] = None,
                             use_fp8: bool = True, round_scale: bool = False,
                             use_ue8m0: bool = False, async_finish: bool = False,
                             return_recv_hook: bool = False):
        """Sends each token to the ranks of its experts; what arrives is laid out per local expert.

        x: bfloat16 or float32 [tokens, hidden], tokens <= num_max_dispatch_tokens_per_rank (the
        same bound on every rank; 0 tokens allowed); topk_idx int64 [tokens, topk], experts in
        [0, num_experts) or -1, none twice in a token. With L = num_experts / num_ranks local
        experts and R = num_ranks * num_max_dispatch_tokens_per_rank rows per expert, returns
        (recv_x, recv_count, handle, None, hook):
          recv_x: use_fp8: a tuple (codes [L, R, hidden] of FP8_DTYPE, E4M3: float8_e4m3fn, or
            uint8 on torch 1.13; scales [L, R, hidden / 128] float32, or uint8 UE8M0 exponents
            e + 127 with use_ue8m0, one byte per 128 channels, not DeepEP's packed int32); a
            channel decodes as code * scale (hidden % 128 == 0; round_scale: powers of two).
            Else x's dtype [L, R, hidden], x's rows bit for bit.
          recv_count: int32 [L]: rows [e, 0 .. recv_count[e]) hold expert e's tokens, ordered by
            source rank then token (deterministic, unlike DeepEP's arrival order); the other
            rows are not written.
          handle: opaque (DeepEP's recv_src_info and layout live inside), for
            low_latency_combine.
          hook: None, or with return_recv_hook a callable: the call returns once its transfers
            are posted, and calling hook() waits for them and writes recv_x and recv_count (they
            are not valid before; the hook keeps them alive). Calling it again does nothing; a
            hook never called is waited for when it is garbage-collected. Two calls may be in
            flight per Buffer (dispatch A, dispatch B, hook A, hook B); a third raises.
        cumulative_local_expert_recv_stats: int32 [L], recv_count is added to it once the data
        is valid (after the hook). dispatch_wait_recv_cost_stats is not supported (None).
        Collective; events are None (async_finish must be False)."""
        _synchronous(None, async_finish)
        if dispatch_wait_recv_cost_stats is not None:
            raise NotImplementedError("chorus low_latency_dispatch: dispatch_wait_recv_cost_stats is not "
                                      "supported (pass None)")
        stats = cumulative_local_expert_recv_stats
        if stats is not None and (not isinstance(stats, torch.Tensor) or stats.dtype != torch.int32
                                  or stats.dim() != 1):
            raise ValueError("chorus low_latency_dispatch: cumulative_local_expert_recv_stats must be "
                             "an int32 tensor [num_experts / num_ranks]")
        recv_x, recv_scales, recv_count, handle, hook = self._buffer.low_latency_dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale,
            use_ue8m0, return_recv_hook)
        if stats is not None:
            if stats.shape != recv_count.shape:
                raise ValueError(f"chorus low_latency_dispatch: cumulative_local_expert_recv_stats has "
                                 f"shape {list(stats.shape)}, not {list(recv_count.shape)}")
            if hook is None:
                stats += recv_count
            else:
                hook = _StatsHook(hook, stats, recv_count)
        if use_fp8:
            recv_x = (recv_x.view(FP8_DTYPE), recv_scales)
        return recv_x, recv_count, handle, None, hook

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor,
                            topk_weights: torch.Tensor, handle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False,
                            return_recv_hook: bool = False, out: Optional[torch.Tensor] = None,
                            combine_wait_recv_cost_stats: Optional[torch.Tensor] = None):
        """Sends each expert output row back to its token's rank and sums them there, weighted.

        x: bfloat16 or float32 [L, R, hidden] (recv_x's layout; either dtype, whatever the
        dispatch sent): expert e's output for the token of recv_x[e, j] in x[e, j], j <
        recv_count[e]. topk_idx: the dispatch's (checked); topk_weights float32 [tokens, topk].
        Returns (combined_x, None, hook): combined_x [tokens, hidden] of x's dtype (written into
        `out` when given: contiguous, that shape and dtype), for each token the sum over its
        slots k in order, topk_idx[t, k] != -1, of topk_weights[t, k] * its row, in float, one
        rounding at the end (<chorus/ep.h>); zeros for a token without experts. hook: as for
        low_latency_dispatch (combined_x valid once it is called). The dispatch's hook must have
        run; the handle may be combined any number of times. use_logfmt, zero_copy and
        combine_wait_recv_cost_stats are not supported. Collective; events are None."""
        _synchronous(None, async_finish)
        if use_logfmt or zero_copy or combine_wait_recv_cost_stats is not None:
            raise NotImplementedError("chorus low_latency_combine: use_logfmt, zero_copy and "
                                      "combine_wait_recv_cost_stats are not supported")
        if not isinstance(handle, _C.EpLowLatencyHandle):
            raise TypeError(f"chorus low_latency_combine: handle must be what low_latency_dispatch "
                            f"returned, not {type(handle).__name__}")
        combined_x, hook = self._buffer.low_latency_combine(x, topk_idx, topk_weights, handle,
                                                            return_recv_hook, out)
        return combined_x, None, hook


class _StatsHook:
    """A low-latency dispatch's hook that also adds recv_count to the statistics, once."""

    def __init__(self, hook, stats: torch.Tensor, recv_count: torch.Tensor):
        self._hook, self._stats, self._count = hook, stats, recv_count

    def __call__(self) -> None:
        self._hook()
        if self._count is not None:
            self._stats += self._count
            self._count = None

    @property
    def done(self) -> bool:
        return self._hook.done


def _event_of(previous_event):
    """The C event behind a previous_event (an EventOverlap of this module, or None)."""
    if previous_event is None:
        return None
    if not isinstance(previous_event, EventOverlap):
        raise TypeError("chorus EP: previous_event must be an EventOverlap of chorus_torch.ep, not "
                        f"{type(previous_event).__name__}")
    return previous_event.event


def _overlap(event):
    return None if event is None else EventOverlap(event)


def _synchronous(previous_event, async_finish: bool) -> None:
    if previous_event is not None or async_finish:
        raise NotImplementedError("chorus low-latency calls overlap through return_recv_hook: "
                                  "previous_event must be None and async_finish False")
