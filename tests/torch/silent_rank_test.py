# SPDX-License-Identifier: Apache-2.0
"""The group's timeout bounds an operation that waits for a rank that is alive but silent.

What it proves: init_process_group(timeout=4 s), CHORUS_TIMEOUT_MS unset (its default is 300 s);
after one successful all_reduce, rank 2 stays alive but stops calling (it sleeps) while the
others enter the next all_reduce. Every survivor must get a RuntimeError after about the
group's timeout (between 3 and 30 s), and for the chorus backend its message must name the
silent peer ("rank 2") and the timeout ("timeout 4000 ms"). A watchdog os._exit(3)s after
90 s, so a hang is a failure, not a stuck job. Rank 2 exits once the others are done.

Each survivor prints "silent rank test: OK on rank R"; the runner (run_torch_tests.sh)
counts those lines.

Usage (needs at least 3 ranks):
  PYTHONPATH=<build>/bindings/torch /usr/bin/python3 -m torch.distributed.run \\
      --nproc_per_node 3 --redirects 9:1 --tee 9:1 --master_port 29515 \\
      tests/torch/silent_rank_test.py [--backend-under-test gloo]
With gloo under test only "an exception is raised in time" is checked.
"""
import os
import sys
import time

# The group's timeout, not this, must be what fires.
os.environ.pop("CHORUS_TIMEOUT_MS", None)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_test_common as common  # noqa: E402

args = common.parse_args("Chorus torch backend silent-rank test")
common.import_backend(args)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SILENT = 2
TIMEOUT_S = 4
common.start_watchdog(90.0, "silent_rank_test")
RANK, WS = common.init_default_group(args, timeout_s=TIMEOUT_S)
if WS <= SILENT:
    print("silent rank test: needs at least %d ranks, got %d" % (SILENT + 1, WS), flush=True)
    os._exit(2)

t = torch.full((4096,), float(RANK) + 0.25)
dist.all_reduce(t)
expect = sum(r + 0.25 for r in range(WS))
if not torch.allclose(t, torch.full_like(t, expect)):
    print("silent rank test: FAIL on rank %d: first all_reduce gave %r, expected %r" % (RANK, t[0].item(), expect),
          flush=True)
    os._exit(1)

if RANK == SILENT:
    # Alive, connected, and silent for longer than the survivors may take; then gone.
    time.sleep(35.0)
    print("[rank %d] silent rank leaves" % RANK, flush=True)
    os._exit(0)

t0 = time.monotonic()
err = None
try:
    dist.all_reduce(torch.ones(4096))
except RuntimeError as e:
    err = e
elapsed = time.monotonic() - t0

ok = True
if err is None:
    print("silent rank test: FAIL on rank %d: all_reduce with a silent peer returned after %.1f s" % (RANK, elapsed),
          flush=True)
    ok = False
else:
    msg = str(err).strip().replace("\n", " | ")
    print("[rank %d] RuntimeError after %.1f s: %s" % (RANK, elapsed, msg), flush=True)
    if not 0.75 * TIMEOUT_S <= elapsed <= 30.0:
        print("silent rank test: FAIL on rank %d: error after %.1f s, not about the group's %d s"
              % (RANK, elapsed, TIMEOUT_S), flush=True)
        ok = False
    if args.backend_under_test != "gloo":
        for want in ("rank %d" % SILENT, "timeout %d ms" % (TIMEOUT_S * 1000)):
            if want not in msg:
                print("silent rank test: FAIL on rank %d: message does not say '%s'" % (RANK, want), flush=True)
                ok = False

if ok:
    print("silent rank test: OK on rank %d (backend under test %s, error after %.1f s)"
          % (RANK, args.backend_under_test, elapsed), flush=True)
sys.stdout.flush()
sys.stderr.flush()
# No destroy_process_group: the group is broken.
os._exit(0 if ok else 1)
