# SPDX-License-Identifier: Apache-2.0
"""Shared plumbing for the Chorus torch.distributed backend tests (tests/torch/*.py).

Not a test by itself. It gives every test the same command line
(--backend-under-test, --build-dir, --init-method), finds and imports the
`chorus_torch` extension (which registers the "chorus" backend as a side
effect), initialises the default process group with the backend under test,
and arms a watchdog so that a hung collective turns into a failing exit code
instead of a stuck CI job.
"""
import argparse
import datetime
import os
import sys
import threading
import time


def parse_args(description, extra=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend-under-test", default=os.environ.get("CHORUS_TORCH_BACKEND_UNDER_TEST", "chorus"),
                   help="backend of the default group (default: chorus; 'gloo' lets the test be developed and "
                        "sanity-checked without the chorus backend)")
    p.add_argument("--build-dir", default=None,
                   help="Chorus build dir; <build-dir>/bindings/torch is put on sys.path to find chorus_torch")
    p.add_argument("--init-method", default="env://",
                   help="init_method for the default group: env:// (torchrun), tcp://host:port or file:///path")
    p.add_argument("--rank", type=int, default=None, help="only needed when not launched by torchrun")
    p.add_argument("--world-size", type=int, default=None, help="only needed when not launched by torchrun")
    p.add_argument("--watchdog-s", type=float, default=180.0,
                   help="os._exit(3) if the test has not finished after this many seconds (a hang is a failure)")
    if extra:
        extra(p)
    return p.parse_args()


def import_backend(args):
    """Import chorus_torch (registers the backend) unless we only test gloo."""
    paths = []
    if args.build_dir:
        paths.append(os.path.join(args.build_dir, "bindings", "torch"))
    if os.environ.get("CHORUS_TORCH_PATH"):
        paths.append(os.environ["CHORUS_TORCH_PATH"])
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    if args.backend_under_test == "chorus":
        import chorus_torch  # noqa: F401  (import registers the "chorus" backend)


# What the test is doing now; the watchdog names it when it fires, so a hang report says where.
CURRENT = ["start-up"]


def start_watchdog(seconds, what):
    """A daemon thread that kills the process if the test hangs.

    os._exit (not sys.exit) because the main thread is presumably blocked
    inside a C++ collective and would never see a Python exception."""
    def run():
        time.sleep(seconds)
        msg = "WATCHDOG: %s did not finish within %.0f s (hung in: %s), exiting with 3\n" % (what, seconds, CURRENT[0])
        sys.stdout.write(msg)
        sys.stdout.flush()
        sys.stderr.write(msg)
        sys.stderr.flush()
        os._exit(3)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def init_default_group(args, timeout_s=60):
    import torch.distributed as dist
    kw = {}
    if args.rank is not None:
        kw["rank"] = args.rank
    elif "RANK" in os.environ:
        kw["rank"] = int(os.environ["RANK"])
    if args.world_size is not None:
        kw["world_size"] = args.world_size
    elif "WORLD_SIZE" in os.environ:
        kw["world_size"] = int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend_under_test, init_method=args.init_method,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return dist.get_rank(), dist.get_world_size()
