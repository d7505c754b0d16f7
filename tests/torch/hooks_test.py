# SPDX-License-Identifier: Apache-2.0
"""Chorus's DDP communication hooks (chorus_torch.hooks) against plain DDP on the same group.

Run under torchrun (run_torch_tests.sh). The same model, seeds and data are trained three ways on
the default "chorus" group: plain DDP, DDP with hooks.overlap_hook (priority, then FIFO), and
with hooks.fp8_hook. Checks:
  - overlap_hook: the scheduler took the steps after DDP settled its buckets, and the parameters
    equal plain DDP's to double precision rounding (the scheduler averages the same buckets);
  - fp8_hook: every rank holds bit-identical parameters (the compressed AllReduce gives every rank
    the same bytes), within a few percent of plain DDP's after the steps, and so is the loss.
Prints "hooks test: OK on rank R"; exits non-zero on a failure. Chorus only (the hooks need it).
"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_test_common as common

STEPS = 12


def train(hook, state, dtype, rank):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10)).to(dtype)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)  # several buckets
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(dtype)
        y = torch.randint(0, 10, (16,), generator=g)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return torch.cat([p.detach().flatten() for p in model.parameters()]), losses


def identical_across_ranks(t):
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return all(torch.equal(everyone[0], e) for e in everyone)


def main():
    args = common.parse_args(__doc__)
    if args.backend_under_test != "chorus":
        print("hooks test: skipped (the hooks need the chorus backend)")
        return 0
    common.import_backend(args)
    from chorus_torch import hooks
    common.init_default_group(args)
    common.start_watchdog(args.watchdog_s, "hooks test")
    rank = dist.get_rank()
    failures = []

    plain, _ = train(None, None, torch.float64, rank)
    for policy in ("priority", "fifo"):
        state = hooks.OverlapState(policy=policy)
        params, _ = train(hooks.overlap_hook, state, torch.float64, rank)
        diff = float((params - plain).abs().max())
        print(f"[rank {rank}] overlap_hook {policy}: {state.scheduled_steps} of {STEPS} steps "
              f"scheduled, max |param - plain DDP| {diff:.3g}", flush=True)
        if state.scheduled_steps != STEPS - 2:
            failures.append(f"overlap_hook {policy}: only {state.scheduled_steps} steps scheduled")
        if diff > 1e-12:
            failures.append(f"overlap_hook {policy}: parameters differ from plain DDP by {diff}")

    plain32, plain_losses = train(None, None, torch.float32, rank)
    fp8, losses = train(hooks.fp8_hook, hooks.FP8State(), torch.float32, rank)
    rel = float((fp8 - plain32).norm() / plain32.norm())
    same = identical_across_ranks(fp8)
    print(f"[rank {rank}] fp8_hook: |params - plain| / |plain| = {rel:.3g}, identical on every "
          f"rank: {same}, loss {losses[0]:.4f} -> {losses[-1]:.4f} (plain {plain_losses[-1]:.4f})",
          flush=True)
    if not same:
        failures.append("fp8_hook: parameters differ between ranks")
    if not rel < 0.05:
        failures.append(f"fp8_hook: parameters {rel:.3g} (relative) away from plain DDP's")
    # Random labels: the loss need not fall; it must stay with plain DDP's.
    if not abs(losses[-1] - plain_losses[-1]) <= 0.01 * abs(plain_losses[-1]):
        failures.append(f"fp8_hook: final loss {losses[-1]:.4f}, plain DDP's {plain_losses[-1]:.4f}")

    for f in failures:
        print(f"[rank {rank}] FAIL {f}", flush=True)
    if not failures:
        print(f"hooks test: OK on rank {rank}", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
