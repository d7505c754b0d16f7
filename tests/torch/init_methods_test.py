# SPDX-License-Identifier: Apache-2.0
"""The Chorus backend bootstraps from every torch Store flavour: env://, tcp://, file://.

What it proves: init_process_group("chorus", init_method=..., rank=, world_size=,
timeout=) works with the TCPStore (env://, tcp://) and the FileStore (file://)
that torch wraps in a PrefixStore, and the resulting group (plus a subgroup made
by new_group, which gets a differently-prefixed store) computes correctly.
Launched WITHOUT torchrun, as plain processes, so nothing comes from torchrun's
environment:
  for r in 0 1 2; do /usr/bin/python3 tests/torch/init_methods_test.py --rank $r --world-size 3 \
      --init-method tcp://127.0.0.1:29516 & done; wait
  (or --init-method file:///tmp/some-fresh-file)
Prints "init methods test: OK on rank R"; exit status 0 iff all checks hold.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_test_common as common  # noqa: E402

args = common.parse_args("Chorus torch backend init_method test")
common.import_backend(args)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

common.start_watchdog(min(args.watchdog_s, 120.0), "init_methods_test")
RANK, WS = common.init_default_group(args, timeout_s=30)
ok = True

t = torch.full((5,), float(RANK + 1))
dist.all_reduce(t)
if not torch.all(t == WS * (WS + 1) / 2):
    print("init methods test: FAIL on rank %d: all_reduce gave %r" % (RANK, t.tolist()), flush=True)
    ok = False
b = torch.full((3,), float(RANK))
dist.broadcast(b, WS - 1)
if not torch.all(b == WS - 1):
    print("init methods test: FAIL on rank %d: broadcast gave %r" % (RANK, b.tolist()), flush=True)
    ok = False
sub_ranks = list(range(1, WS)) if WS > 1 else [0]
sub = dist.new_group(sub_ranks, backend=args.backend_under_test)
if RANK in sub_ranks:
    s = torch.ones(4, dtype=torch.int64)
    dist.all_reduce(s, group=sub)
    if not torch.all(s == len(sub_ranks)):
        print("init methods test: FAIL on rank %d: subgroup all_reduce gave %r" % (RANK, s.tolist()), flush=True)
        ok = False
dist.barrier()
print("init methods test: %s on rank %d (%s, %s)" % ("OK" if ok else "FAIL", RANK, args.init_method,
                                                      args.backend_under_test), flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
