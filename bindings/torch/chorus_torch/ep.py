# SPDX-License-Identifier: Apache-2.0
"""MoE expert parallelism on a "chorus" group: DeepEP's V1 Buffer (normal mode) on CPU tensors.

    from chorus_torch.ep import Buffer
    buf = Buffer(group, Buffer.get_buffer_size_hint(group.size(), max_tokens, hidden, topk))
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_idx, recv_w, recv_per_expert, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
    # ... expert outputs, weighted by recv_w and summed per received token: y ...
    combined_x, combined_w, _ = buf.combine(y, handle, topk_weights=recv_w)

The methods, arguments and results are DeepEP's, with <chorus/ep.h>'s semantics (the routing,
ordering and summation rules are written there). Differences, all deliberate:
  - Synchronous: every call has finished when it returns. The events DeepEP returns last are
    None; previous_event must be None and async_finish False (an event to wait for would be a
    lie). allocate_on_comm_stream and config are accepted and ignored: there are no streams.
  - FP8: torch 1.13 has no float8 dtype, so an FP8 x is a tuple (uint8 tensor of E4M3 codes
    [tokens, hidden], float32 scales [tokens, hidden / 128]); recv_x is such a tuple too.
  - topk_idx (int64) is required: the routing comes from it. num_tokens_per_rank,
    is_token_in_rank and num_tokens_per_expert (get_dispatch_layout's) are required as in
    DeepEP; the C API checks them against topk_idx.
  - Cached dispatch (handle=..., DeepEP's layout reuse) is refused: the C API routes every
    dispatch afresh and has no entry point that reuses a handle's routing.
  - Output size: recv_x has exactly the rows that arrive. Before each dispatch the ranks sum
    their per-destination token counts (one ncclReduceScatter of num_ranks int64), so the
    outputs need no worst-case capacity (num_ranks x max_tokens rows) at the price of one small
    collective per dispatch. num_worst_tokens (DeepEP's padded outputs) is not supported.
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


class Buffer:
    """An EP buffer bound to a "chorus" process group (None: the default group).

    num_bytes: the staging memory, allocated once (get_buffer_size_hint); DeepEP's num_nvl_bytes
    is accepted as another name for it. There is no RDMA buffer and no low-latency mode.
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
        size = num_bytes if num_bytes is not None else num_nvl_bytes
        if not size:
            raise ValueError("chorus Buffer: num_bytes is needed (Buffer.get_buffer_size_hint gives it)")
        if num_rdma_bytes or low_latency_mode:
            raise ValueError("chorus Buffer: host memory only: no RDMA buffer (num_rdma_bytes=0) and "
                             "no low-latency mode")
        self.group = group
        self.explicitly_destroy = explicitly_destroy  # DeepEP's flag; destroy() works either way
        self._buffer = _C.EpBuffer(group, size)
        self.rank = self._buffer.rank
        self.num_ranks = self._buffer.num_ranks
        self.num_bytes = self._buffer.num_bytes

    @staticmethod
    def get_buffer_size_hint(num_ranks: int, max_tokens: int, hidden: int, topk: int) -> int:
        """Bytes for every dispatch and combine of up to max_tokens tokens per rank."""
        return _C.ep_buffer_size_hint(num_ranks, max_tokens, hidden, topk)

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
        None (no event)). Local: no communication."""
        _synchronous(previous_event, async_finish)
        per_rank, per_expert, in_rank = self._buffer.get_dispatch_layout(topk_idx, num_experts)
        return per_rank, None, per_expert, in_rank, None

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
        num_recv_tokens_per_expert_list a list of ints, each rounded up to expert_alignment.
        Blocking, collective."""
        _synchronous(previous_event, async_finish)
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
        recv_x, recv_scales, recv_idx, recv_w, per_expert, h = self._buffer.dispatch(
            x, scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
            num_tokens_per_expert, expert_alignment)
        if recv_scales is not None:
            recv_x = (recv_x, recv_scales)
        return recv_x, recv_idx, recv_w, per_expert, h, None

    def combine(self, x: torch.Tensor, handle, topk_weights: Optional[torch.Tensor] = None,
                bias=None, config=None, previous_event=None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False):
        """Returns each token's rows to its source rank and adds them up there.

        x: float32 or bfloat16 [handle.num_recv_tokens, hidden], in recv_x's order.
        Returns (combined_x [tokens, hidden] of x's dtype, combined_topk_weights float32
        [tokens, topk] or None without topk_weights, None): the sums in float, in ascending
        rank order, rounded once (<chorus/ep.h>). The handle may be combined any number of
        times. Blocking, collective."""
        _synchronous(previous_event, async_finish)
        if bias is not None:
            raise NotImplementedError("chorus combine: bias is not supported")
        if not isinstance(handle, _C.EpHandle):
            raise TypeError(f"chorus combine: handle must be what dispatch returned, not {type(handle).__name__}")
        combined_x, combined_w = self._buffer.combine(x, handle, topk_weights)
        return combined_x, combined_w, None


def _synchronous(previous_event, async_finish: bool) -> None:
    if previous_event is not None or async_finish:
        raise NotImplementedError("chorus EP calls are synchronous: previous_event must be None and "
                                  "async_finish False (every call has finished when it returns)")
