# SPDX-License-Identifier: Apache-2.0
"""DDP communication hooks from Chorus.

    from chorus_torch import hooks
    ddp.register_comm_hook(hooks.FP8State(), hooks.fp8_hook)

fp8_hook averages each gradient bucket with Chorus's FP8 AllReduce (block-scaled E4M3 by
default, about 26 % of fp32's bytes on the wire), with error feedback: what quantization
dropped from a bucket in one step is added back before the next step's quantization, so the
error does not accumulate. The group must be a "chorus" group.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from ._C import ProcessGroupChorus


@dataclass
class FP8State:
    """Settings of fp8_hook. process_group: None for the default group."""
    process_group: Optional[dist.ProcessGroup] = None
    format: str = "e4m3"  # or "e5m2"
    block_size: int = 128
    error_feedback: bool = True


def fp8_hook(state: FP8State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    pg = state.process_group or dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupChorus):
        raise RuntimeError(f"chorus_torch.hooks.fp8_hook needs a 'chorus' process group, not {type(pg).__name__}")
    work = pg.allreduce_compressed(bucket.buffer(), key=bucket.index(), format=state.format,
                                   block_size=state.block_size,
                                   error_feedback=state.error_feedback, average=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class OverlapState:
    """Settings and state of overlap_hook.

    policy: "priority" (the buckets of the first layers of the forward pass first, so the next
    forward pass can start on them) or "fifo" (as they became ready, as DDP does); fp8: the
    buckets travel as FP8 with error feedback; bucket_bytes / partition_bytes: the scheduler's
    fusion cap and partition size (0 / -1: its defaults, 4 MiB each).
    """

    # DDP rebuilds its buckets once, after the first step: the second step's are final.
    LEARNING_STEPS = 2

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, policy: str = "priority",
                 fp8: bool = False, bucket_bytes: int = 0, partition_bytes: int = -1):
        if policy not in ("priority", "fifo"):
            raise ValueError(f"policy must be 'priority' or 'fifo', not {policy!r}")
        self.process_group = process_group
        self.options = _C.OverlapOptions()
        self.options.fifo = policy == "fifo"
        self.options.fp8 = fp8
        self.options.bucket_bytes = bucket_bytes
        self.options.partition_bytes = partition_bytes
        self._steps = 0           # steps whose buckets have all been handed over
        self._step = []           # this step's buckets so far: (index, buffer)
        self._layout = None       # the buffers the scheduler has, by bucket index
        self._setup = None        # the Work that makes the scheduler, until waited for
        self.scheduled_steps = 0  # steps whose buckets went through the scheduler


def overlap_hook(state: OverlapState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Hands DDP's buckets to Chorus's overlap scheduler (<chorus/overlap.h>).

    The scheduler needs every bucket registered before a step starts, and DDP settles its
    buckets only after the first step (it rebuilds them in the order gradients became ready).
    So the first two steps run as plain averaged AllReduces; at the end of the second, every
    rank makes the scheduler with that step's buckets (the same point on every rank: nothing
    rank-local decides it), and the scheduler takes every later step. DDP reallocating a
    bucket after that is an error, not a silent fallback that ranks could take differently.
    """
    pg = state.process_group or dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupChorus):
        raise RuntimeError("chorus_torch.hooks.overlap_hook needs a 'chorus' process group, not "
                           f"{type(pg).__name__}")
    buf = bucket.buffer()
    index = bucket.index()
    last = bucket.is_last()
    if state._steps >= OverlapState.LEARNING_STEPS:
        layout = state._layout
        if index >= len(layout) or layout[index] != (buf.data_ptr(), buf.numel(), buf.dtype):
            raise RuntimeError(
                f"chorus overlap_hook: DDP's bucket {index} is not the one registered with the "
                "overlap scheduler (DDP rebuilt or reallocated its buckets after its second step)")
        if state._setup is not None:
            state._setup.wait()
            state._setup = None
        work = pg.overlap_ready(buf)
        if last:
            state._steps += 1
            state.scheduled_steps += 1
        return work.get_future().then(lambda fut: fut.value()[0])
    state._step.append((index, buf))
    work = dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=pg, async_op=True)
    if last:
        state._steps += 1
        if state._steps == OverlapState.LEARNING_STEPS:
            buffers = [b for _, b in sorted(state._step, key=lambda ib: ib[0])]
            state._layout = [(b.data_ptr(), b.numel(), b.dtype) for b in buffers]
            state._setup = pg.overlap_setup(buffers, state.options)
        state._step = []
    return work.get_future().then(lambda fut: fut.value()[0])
