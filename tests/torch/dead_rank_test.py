# SPDX-License-Identifier: Apache-2.0
"""A rank that dies turns into a prompt Python RuntimeError on the others, not a hang.

What it proves: with CHORUS_TIMEOUT_MS=5000 and an init timeout of 10 s,
after one successful all_reduce, rank 2 leaves abruptly (os._exit(0): no
destroy_process_group, no goodbye) while the survivors are already blocked in
the next all_reduce.  Every survivor must get a RuntimeError within 60 s,
and for the chorus backend its message must name the dead peer ("rank 2").
A watchdog os._exit(3)s after 90 s, so a hang is a failure, not a stuck job.
Afterwards (information only, never fails the test) a survivor tries one more
all_reduce on the broken group and reports whether it also fails fast.

Each survivor prints "dead rank test: OK on rank R" on success; the runner
(run_torch_tests.sh) requires world-1 such lines rather than trusting
torchrun's exit status, because torchrun treats the deliberate death as it
likes.

Usage (needs at least 3 ranks: rank 2 is the one that dies):
  PYTHONPATH=<build>/bindings/torch /usr/bin/python3 -m torch.distributed.run \
      --nproc_per_node 3 --redirects 9:1 --tee 9:1 --master_port 29514 \
      tests/torch/dead_rank_test.py [--backend-under-test gloo]
With gloo under test only "an exception is raised in time" is checked (gloo's
message names an address, not a rank).
"""
import os
import sys
import threading
import time

# Must be in the environment before the backend creates its communicator.
os.environ.setdefault("CHORUS_TIMEOUT_MS", "5000")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_test_common as common  # noqa: E402

args = common.parse_args("Chorus torch backend dead-rank test")
common.import_backend(args)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DEAD = 2
LIMIT_S = 60.0
common.start_watchdog(90.0, "dead_rank_test")
RANK, WS = common.init_default_group(args, timeout_s=10)
UT_NAME = args.backend_under_test
if WS <= DEAD:
    print("dead rank test: needs at least %d ranks, got %d" % (DEAD + 1, WS), flush=True)
    os._exit(2)

t = torch.full((1024,), float(RANK + 1))
dist.all_reduce(t)
expect = WS * (WS + 1) / 2
if not torch.all(t == expect):
    print("dead rank test: FAIL on rank %d: first all_reduce gave %r, expected %r" % (RANK, t[0].item(), expect),
          flush=True)
    os._exit(1)
print("[rank %d] first all_reduce ok" % RANK, flush=True)

if RANK == DEAD:
    # Give the survivors time to enter the next all_reduce, so the death happens mid-collective.
    time.sleep(1.0)
    print("[rank %d] exiting abruptly" % RANK, flush=True)
    sys.stdout.flush()
    os._exit(0)

t0 = time.monotonic()
err = None
try:
    dist.all_reduce(torch.ones(1024))
except RuntimeError as e:
    err = e
elapsed = time.monotonic() - t0

ok = True
if err is None:
    print("dead rank test: FAIL on rank %d: all_reduce with a dead peer returned normally after %.1f s" %
          (RANK, elapsed), flush=True)
    ok = False
else:
    msg = str(err)
    print("[rank %d] RuntimeError after %.1f s: %s" % (RANK, elapsed, msg.strip().replace("\n", " | ")), flush=True)
    if elapsed > LIMIT_S:
        print("dead rank test: FAIL on rank %d: error took %.1f s (limit %.0f s)" % (RANK, elapsed, LIMIT_S),
              flush=True)
        ok = False
    # Contract: the message names the operation too; its exact spelling is the backend's choice, so
    # this is reported, not enforced.
    named_op = any(w in msg.lower() for w in ("allreduce", "all_reduce", "all-reduce"))
    print("[rank %d] info: message %s the operation" % (RANK, "names" if named_op else "does NOT name"), flush=True)
    if UT_NAME != "gloo" and ("rank %d" % DEAD) not in msg:
        print("dead rank test: FAIL on rank %d: message does not name 'rank %d'" % (RANK, DEAD), flush=True)
        ok = False


# Information only: does the broken group fail fast on the next call too?  Run in a daemon thread so a
# hang here cannot turn a pass into a failure (the watchdog stays the only hard limit).
def second_call(res):
    t1 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(16))
        res.append("returned normally after %.1f s" % (time.monotonic() - t1))
    except RuntimeError as e:
        res.append("RuntimeError after %.1f s: %s" % (time.monotonic() - t1, str(e).strip().replace("\n", " | ")[:300]))


res = []
th = threading.Thread(target=second_call, args=(res,), daemon=True)
th.start()
th.join(15.0)
print("[rank %d] info: next all_reduce on the broken group: %s" % (RANK, res[0] if res else "still blocked after 15 s"),
      flush=True)

if ok:
    print("dead rank test: OK on rank %d (backend under test %s, error after %.1f s)" % (RANK, UT_NAME, elapsed),
          flush=True)
sys.stdout.flush()
sys.stderr.flush()
# No destroy_process_group: tearing down a group with a dead member may itself block.
os._exit(0 if ok else 1)
