# SPDX-License-Identifier: Apache-2.0
"""Chorus as a torch.distributed backend for CPU tensors.

    import chorus_torch                       # registers the backend "chorus"
    torch.distributed.init_process_group("chorus", init_method="env://", ...)

Every collective torch.distributed offers runs on Chorus's NCCL API (bindings/torch/csrc);
asynchronous operations return Work objects with futures, as NCCL's do, so
DistributedDataParallel overlaps its buckets the same way. Errors are RuntimeErrors with
Chorus's message (the operation, the peer).
"""
import torch.distributed as dist

from ._C import ProcessGroupChorus, create_process_group  # noqa: F401

BACKEND = "chorus"

if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, create_process_group)
