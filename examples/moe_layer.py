# SPDX-License-Identifier: Apache-2.0
"""An expert-parallel MoE layer on the "chorus" backend (chorus_torch.ep.Buffer), checked against
the same layer computed densely.

    PYTHONPATH=build/bindings/torch /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 \
        --redirects 9:1 --tee 9:1 examples/moe_layer.py

(torchrun is Debian's torch 1.13, reached through /usr/bin/python3; --redirects/--tee dodge its
crash on Python 3.11.) Each rank holds --experts-per-rank experts, each an MLP
Linear(hidden, ffn) -> GELU -> Linear(ffn, hidden). A token's router (Linear -> softmax ->
top-k, the k weights renormalised to sum to 1) picks its experts; the layer's output for it is
the weighted sum of their outputs. Per step:
  get_dispatch_layout -> dispatch (each token to the ranks of its experts) -> every local expert
  on the received tokens routed to it, each output times the token's router weight, summed per
  received token -> combine (those sums back to the token's rank, added up there).
With --low-latency the layer uses the low-latency calls instead (DeepEP's decoding path):
  low_latency_dispatch (each token to its experts' rows, per local expert) -> its hook (a model
  would overlap other work before calling it) -> every local expert on its rows ->
  low_latency_combine (the rows back to the token's rank, summed there weighted by the router).
Every expert's and the router's weights come from --seed, so every rank can also compute the
layer densely for its own tokens (every expert on every token); the rank prints the largest
difference between the two ("moe_layer: OK on rank R ...") and exits non-zero if it is above
the tolerance of --dtype (relative to the largest output).
"""
import argparse
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import chorus_torch  # noqa: F401  (registers the "chorus" backend)
from chorus_torch.ep import Buffer

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


class Expert(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x)))


class MoELayer(nn.Module):
    """All num_experts experts are built (from the seed); the EP path runs only this rank's."""

    def __init__(self, buffer, hidden, ffn, num_experts, topk, seed, dtype, max_tokens=0):
        super().__init__()
        torch.manual_seed(seed)
        self.buffer = buffer
        self.topk = topk
        self.max_tokens = max_tokens  # > 0: the low-latency path, up to max_tokens per rank
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(num_experts))
        self.local = num_experts // buffer.num_ranks
        self.first_local = buffer.rank * self.local
        self.to(dtype)

    def route(self, x):
        """topk_idx int64 [tokens, topk] and float32 weights that sum to 1 per token."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, idx = probs.topk(self.topk, dim=-1)
        return idx, weights / weights.sum(dim=-1, keepdim=True)

    def forward(self, x):
        if self.max_tokens:
            return self.forward_low_latency(x)
        idx, weights = self.route(x)
        per_rank, _, per_expert, in_rank, _ = self.buffer.get_dispatch_layout(idx, len(self.experts))
        recv_x, recv_idx, recv_w, _, handle, _ = self.buffer.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=weights)
        # recv_idx holds local expert indices (-1: a slot of an expert elsewhere).
        y = torch.zeros(recv_x.shape, dtype=torch.float32)
        for e in range(self.local):
            rows, slots = (recv_idx == e).nonzero(as_tuple=True)
            if rows.numel():
                out = self.experts[self.first_local + e](recv_x[rows]).float()
                y.index_add_(0, rows, out * recv_w[rows, slots].unsqueeze(1))
        combined, _, _ = self.buffer.combine(y.to(x.dtype), handle)
        return combined

    def forward_low_latency(self, x):
        idx, weights = self.route(x)
        recv_x, recv_count, handle, _, hook = self.buffer.low_latency_dispatch(
            x, idx, self.max_tokens, len(self.experts), use_fp8=False, return_recv_hook=True)
        hook()  # recv_x and recv_count are valid from here on
        # Local expert e's tokens are rows recv_x[e, :recv_count[e]]; its outputs go in the same
        # rows of y (the others are not read). Combine weights and sums them per token.
        y = torch.empty(recv_x.shape, dtype=x.dtype)
        for e, n in enumerate(recv_count.tolist()):
            y[e, :n] = self.experts[self.first_local + e](recv_x[e, :n])
        combined, _, _ = self.buffer.low_latency_combine(y, idx, weights, handle)
        return combined

    def dense(self, x):
        """The same layer without communication: every expert on every token."""
        idx, weights = self.route(x)
        out = torch.zeros(x.shape, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            w = (weights * (idx == e)).sum(dim=-1, keepdim=True)
            out += expert(x).float() * w
        return out.to(x.dtype)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--low-latency", action="store_true", help="low_latency_dispatch / _combine")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)

    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    num_experts = args.experts_per_rank * world
    if args.low_latency:
        size = Buffer.get_low_latency_rdma_size_hint(max(args.tokens, 1), args.hidden, world, num_experts, args.topk)
        buffer = Buffer(dist.group.WORLD, 0, size, low_latency_mode=True)
    else:
        buffer = Buffer(dist.group.WORLD, Buffer.get_buffer_size_hint(world, args.tokens, args.hidden, args.topk))
    with buffer, torch.no_grad():
        layer = MoELayer(buffer, args.hidden, args.ffn, num_experts, args.topk, args.seed, dtype,
                         max_tokens=max(args.tokens, 1) if args.low_latency else 0)
        x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(
            args.seed + 1 + rank)).to(dtype)
        ep, dense = layer(x), layer.dense(x)
    err = float((ep.float() - dense.float()).abs().max()) if args.tokens else 0.0
    scale = float(dense.float().abs().max()) if args.tokens else 0.0
    ok = err <= TOLERANCE[dtype] * max(scale, 1.0)
    print(f"moe_layer: {'OK' if ok else 'TOO LARGE'} on rank {rank} of {world}: {args.tokens} tokens, "
          f"{'low-latency, ' if args.low_latency else ''}{num_experts} experts, top-{args.topk}, {args.dtype}: "
          f"max |EP - dense| = {err:.3g} (outputs up to {scale:.3g})", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
