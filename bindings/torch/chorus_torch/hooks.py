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
