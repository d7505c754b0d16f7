# SPDX-License-Identifier: Apache-2.0
"""DistributedDataParallel training on the Chorus CPU backend matches gloo.

What it proves: a small MLP (Linear(32,64)-ReLU-Linear(64,10)) trained for
20 SGD steps under DDP, with each rank on its own seeded data shard, ends with
  * the same parameters on every rank, bit for bit (DDP only stays in sync if
    the allreduce gives every rank identical bytes), and
  * the same parameters (1e-5 relative) as the identical run on a gloo group
    in the same job,
both with DDP's built-in allreduce and with the Python comm hook
default_hooks.allreduce_hook (the get_future() path).  Each rank starts from
DIFFERENT random weights (seed = rank): DDP's constructor must broadcast
rank 0's state over the group under test, so a broken broadcast shows up too.
Construction also runs the allgather in verify_params_across_processes.

Usage (3 ranks; 2 and 4 work too):
  PYTHONPATH=<build>/bindings/torch /usr/bin/python3 -m torch.distributed.run \
      --nproc_per_node 3 --redirects 9:1 --tee 9:1 --master_port 29513 \
      tests/torch/ddp_test.py [--backend-under-test gloo] [--build-dir <build>]
Exit status 0 iff all comparisons hold; prints "ddp test: OK on rank R".
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_test_common as common  # noqa: E402

args = common.parse_args("Chorus torch backend DDP test",
                         extra=lambda p: p.add_argument("--steps", type=int, default=20))
common.import_backend(args)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

common.start_watchdog(args.watchdog_s, "ddp_test")
RANK, WS = common.init_default_group(args)
UT_NAME = args.backend_under_test
GLOO = dist.new_group(backend="gloo")
torch.set_num_threads(1)   # 2-core shared machine, 3 ranks: avoid oversubscription noise


def train(process_group, hook_state=None, use_hook=False):
    """Train and return the final parameters flattened.

    process_group=None means the default group, i.e. the backend under test."""
    torch.manual_seed(RANK)   # deliberately different per rank: DDP must broadcast rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    # bucket_cap_mb small so the gradients go out in more than one bucket (several allreduces per step)
    ddp = DDP(model, process_group=process_group, bucket_cap_mb=0.004)
    if use_hook:
        ddp.register_comm_hook(state=hook_state, hook=default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(2000 + RANK)   # this rank's data shard
    loss_fn = torch.nn.CrossEntropyLoss()
    first_loss = last_loss = None
    for _ in range(args.steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        first_loss = loss.item() if first_loss is None else first_loss
        last_loss = loss.item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, first_loss, last_loss


failures = []


def expect(cond, what):
    if cond:
        print("[rank %d] ok: %s" % (RANK, what), flush=True)
    else:
        failures.append(what)
        print("[rank %d] FAIL: %s" % (RANK, what), flush=True)


def identical_across_ranks(flat, label):
    # Gathered over gloo (not the group under test) so the judge is independent of the backend.
    outs = [torch.empty_like(flat) for _ in range(WS)]
    dist.all_gather(outs, flat, group=GLOO)
    bad = [r for r in range(WS) if not torch.equal(outs[r], outs[0])]
    expect(not bad, "%s: parameters bit-identical on all ranks%s" %
           (label, "" if not bad else " (ranks %s differ from rank 0, max abs diff %.3g)" %
            (bad, max((outs[r] - outs[0]).abs().max().item() for r in bad))))


def close(a, b, label):
    diff = (a - b).abs().max().item()
    expect(torch.allclose(a, b, rtol=1e-5, atol=1e-6), "%s (max abs diff %.3g)" % (label, diff))


init_ref = None
runs = {}
for label, pg, state, hook in [
        ("%s default group" % UT_NAME, None, None, False),
        ("gloo group", GLOO, None, False),
        ("%s default group + allreduce_hook" % UT_NAME, None, None, True),
        ("gloo group + allreduce_hook", GLOO, GLOO, True)]:
    flat, l0, l1 = train(pg, state, hook)
    runs[label] = flat
    print("[rank %d] %-44s loss %.4f -> %.4f" % (RANK, label, l0, l1), flush=True)
    identical_across_ranks(flat, label)

ut, gl = runs["%s default group" % UT_NAME], runs["gloo group"]
uth, glh = runs["%s default group + allreduce_hook" % UT_NAME], runs["gloo group + allreduce_hook"]
close(ut, gl, "%s DDP == gloo DDP (rtol 1e-5)" % UT_NAME)
close(uth, glh, "%s DDP+allreduce_hook == gloo DDP+allreduce_hook (rtol 1e-5)" % UT_NAME)
close(uth, gl, "%s DDP+allreduce_hook == gloo DDP (rtol 1e-5)" % UT_NAME)
# Guard against a vacuous pass: training must have moved the weights away from rank 0's init.
torch.manual_seed(0)
init0 = torch.cat([p.detach().reshape(-1) for p in
                   torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).parameters()])
expect((ut - init0).abs().max().item() > 1e-3, "training changed the parameters")

dist.barrier(group=GLOO)
if failures:
    print("ddp test: %d FAILURES on rank %d: %s" % (len(failures), RANK, "; ".join(failures)), flush=True)
    os._exit(1)
print("ddp test: OK on rank %d (backend under test %s, world %d, %d steps)" % (RANK, UT_NAME, WS, args.steps),
      flush=True)
dist.destroy_process_group()
