#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# File: bench/compare/compare.py
"""Side-by-side performance of Chorus, Open MPI and Gloo on this host, in one run.

  /usr/bin/python3 bench/compare/compare.py [--quick] [--build-dir DIR] [--out DIR]

Measures, for 2 and 4 ranks, over shared memory and over TCP, 8 B to 128 MiB (factor 2):
Chorus (chorus-run + bench/coll/*_perf), Open MPI (mpirun + chorus_mpi_coll_bench, vader or
tcp btl), Gloo (torch.distributed via /usr/bin/python3, TCP loopback only) and the machine's
limits (chorus_memcpy_bw, chorus_tcp_bw); then writes results.json, ratios.md and PNG plots
into the output directory. With --transports ucx (opt-in) also Chorus's UCX transport against
Open MPI's pml ucx, both with the same UCX_TLS (--ucx-tls, default tcp,self), reported in a
section of its own. See bench/compare/README.md. Standard library + matplotlib only.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

COLLS = ["allreduce", "reduce_scatter", "allgather", "alltoall", "bcast"]
COLL_TITLE = {"allreduce": "AllReduce", "reduce_scatter": "ReduceScatter",
              "allgather": "AllGather", "alltoall": "AlltoAll", "bcast": "Broadcast"}
CHORUS_TOOL = {"allreduce": "all_reduce_perf", "reduce_scatter": "reduce_scatter_perf",
               "allgather": "all_gather_perf", "alltoall": "alltoall_perf",
               "bcast": "broadcast_perf"}
LIBS = ["chorus", "ompi", "gloo"]
LIB_TITLE = {"chorus": "Chorus", "ompi": "Open MPI", "gloo": "Gloo"}
TRANSPORTS = ["shm", "tcp"]  # the issue 3 comparison: its tables, plots and targets
# "ucx": Chorus (CHORUS_TRANSPORT=UCX) against Open MPI's pml ucx, both over UCX with the same
# UCX_TLS / UCX_NET_DEVICES (--ucx-tls, --ucx-net-devices); Gloo has no UCX. Reported in its own
# section of ratios.md, never counted toward the issue 3 targets.
ALL_TRANSPORTS = TRANSPORTS + ["ucx"]
MiB = 1 << 20

# Size bands: each is one invocation of a tool (-b, -e, -f) with its own -n and -w. The tools
# (nccl-tests' method) allocate -e bytes and let successive timed calls use successive size-byte
# slices of them, so the cache footprint of a size depends on -e: a band ending at 1 MiB would
# time 1 MiB always in the same, cache-hot buffer. So every size from 16 KiB up is measured in
# one sweep to 128 MiB (buffers of 128 MiB, as `-b 8 -e 128M` would), and only the latency-bound
# small sizes get their own band with many iterations (buffers of 8 KiB; in a full sweep those
# sizes' 200 slices, at most 1.6 MiB, stay in cache too). "L" is measured --reps times at 2 ranks; in band A only
# allreduce repeats (2 ranks, and 4 ranks over shm: the 8-B latency targets).
FULL_BANDS = [
    {"name": "A", "b": 8, "e": 8 << 10, "f": 2, "n": 200, "w": 20},
    {"name": "L", "b": 16 << 10, "e": 128 * MiB, "f": 2, "n": 10, "w": 2},
]
QUICK_BANDS = [
    {"name": "A", "b": 8, "e": 4 << 10, "f": 8, "n": 100, "w": 10},
    {"name": "L", "b": 1 * MiB, "e": 128 * MiB, "f": 2, "n": 3, "w": 1},
]

# Crude time model for the estimate: seconds per call = lat + size / bw (bw in B/s), per
# (library, transport, ranks), fitted to a run on a quiet 2-core VM; plus a start-up cost per job.
MODEL = {
    ("chorus", "shm", 2): (20e-6, 3.8e9), ("chorus", "shm", 4): (90e-6, 1.6e9),
    ("chorus", "tcp", 2): (20e-6, 2.2e9), ("chorus", "tcp", 4): (150e-6, 0.8e9),
    ("ompi", "shm", 2): (1e-6, 2.6e9), ("ompi", "shm", 4): (8e-6, 1.25e9),
    ("ompi", "tcp", 2): (10e-6, 1.9e9), ("ompi", "tcp", 4): (20e-6, 0.73e9),
    ("gloo", "tcp", 2): (300e-6, 2.1e9), ("gloo", "tcp", 4): (1000e-6, 1.0e9),
    # UCX: the tcp figures as a start (UCX_TLS=tcp,self runs over loopback TCP too); not fitted.
    ("chorus", "ucx", 2): (20e-6, 2.2e9), ("chorus", "ucx", 4): (150e-6, 0.8e9),
    ("ompi", "ucx", 2): (10e-6, 1.9e9), ("ompi", "ucx", 4): (20e-6, 0.73e9),
}
# Start-up seconds per job, per library; (library, transport) entries override it (UCX creates a
# UCP context and wires up endpoints: a guess, about +0.2 s seen for mpirun on a loaded VM).
STARTUP = {"chorus": 0.1, "ompi": 0.3, "gloo": 3.0, ("chorus", "ucx"): 0.3, ("ompi", "ucx"): 0.5}
# Seconds per byte of size for one checked call (input generation, call, comparison), per library.
CHECK_COST = {"chorus": 2 / 0.2e9, "ompi": 1 / 0.2e9, "gloo": 1 / 0.03e9}


def log(msg):
    print(msg, flush=True)


def fmt_size(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"


def parse_size(text):
    """'64K', '1M', '8' -> bytes."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult


def band_sizes(band):
    out, s = [], band["b"]
    while s <= band["e"]:
        out.append(s)
        s *= band["f"]
    return out


def tail(text, lines=15):
    text = text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
    return "\n".join(text.strip().splitlines()[-lines:])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_busy_s():
    """Seconds of CPU time spent by the whole machine (all cores) since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def foreign_load(seconds):
    """Cores used by other processes over `seconds` while this script runs nothing."""
    b0 = cpu_busy_s()
    time.sleep(seconds)
    b1 = cpu_busy_s()
    return None if b0 is None else max(0.0, (b1 - b0) / seconds)


def run_cmd(cmd, timeout, env=None, log_path=None):
    """Runs cmd in its own session; on timeout kills that process group. Returns a dict."""
    t0 = time.monotonic()
    busy0, ours0 = cpu_busy_s(), children_cpu_s()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             start_new_session=True)
    except OSError as e:
        return {"rc": None, "status": "failed", "error": f"cannot start: {e}", "elapsed_s": 0.0,
                "stdout": "", "stderr": ""}
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)  # the group of the child we started, nothing else
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = b"", b""
    elapsed = time.monotonic() - t0
    busy1, ours1 = cpu_busy_s(), children_cpu_s()
    out = (out or b"").decode(errors="replace")
    err = (err or b"").decode(errors="replace")
    if log_path:
        with open(log_path, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n# --- stdout ---\n" + out + "# --- stderr ---\n" + err)
    r = {"rc": p.returncode, "elapsed_s": round(elapsed, 3), "stdout": out, "stderr": err}
    if busy0 is not None and elapsed > 0:
        # CPU used by processes other than this job's, in cores (machine noise).
        r["foreign_cores"] = round(max(0.0, (busy1 - busy0) - (ours1 - ours0)) / elapsed, 2)
    if timed_out:
        r["status"] = "timeout"
        r["error"] = f"timed out after {timeout:.0f} s (killed)"
    elif p.returncode != 0:
        r["status"] = "failed"
        r["error"] = f"exit status {p.returncode}"
    else:
        r["status"] = "ok"
    return r


# ------------------------------------------------------------------------------------------
# Discovery


def find_tools(build_dir):
    def exe(*parts):
        p = os.path.join(build_dir, *parts)
        return p if os.path.isfile(p) and os.access(p, os.X_OK) else None

    tools = {"chorus_run": exe("tools", "chorus-run"),
             "chorus_info": exe("tools", "chorus-info"),
             "perf": {c: exe("bench", "coll", CHORUS_TOOL[c]) for c in COLLS},
             "mpi_bench": exe("bench", "peers", "chorus_mpi_coll_bench"),
             "memcpy_bw": exe("bench", "peers", "chorus_memcpy_bw"),
             "tcp_bw": exe("bench", "peers", "chorus_tcp_bw"),
             "gloo_bench": os.path.join(REPO, "bench", "peers", "gloo_bench.py")}
    return tools


def chorus_registered_transports(chorus_info):
    """The transport names chorus-info lists under "Transports (registered ...)", or None."""
    r = run_cmd([chorus_info], 60)
    if r["status"] != "ok":
        return None
    names, inside = [], False
    for line in r["stdout"].splitlines():
        if line.startswith("Transports"):
            inside = True
        elif inside and line.startswith("  ") and not line.startswith("   "):
            names.append(line.split()[0])
        elif inside and not line.startswith(" "):
            break
    return names


def probe_peers(tools, python, transports=()):
    """Which peers can run, with the reason when one cannot. With "ucx" in `transports`, also
    whether each library can run over UCX: peers[lib]["ucx"] (bool) and "ucx_why"."""
    peers = {}
    missing = [c for c in COLLS if not tools["perf"][c]]
    if not tools["chorus_run"] or missing:
        peers["chorus"] = {"ok": False, "why": "not built: " + ", ".join(
            (["chorus-run"] if not tools["chorus_run"] else []) + [CHORUS_TOOL[c] for c in missing])}
    else:
        peers["chorus"] = {"ok": True}
    mpirun = shutil.which("mpirun")
    if not mpirun:
        peers["ompi"] = {"ok": False, "why": "mpirun not found on PATH"}
    elif not tools["mpi_bench"]:
        peers["ompi"] = {"ok": False, "why": "chorus_mpi_coll_bench not built (CMake found no MPI?)"}
    else:
        r = run_cmd([mpirun, "--version"], 30)
        ver = (r["stdout"] or r["stderr"]).strip().splitlines()[:1]
        peers["ompi"] = {"ok": r["status"] == "ok", "mpirun": mpirun, "version": ver[0] if ver else "?"}
        if r["status"] != "ok":
            peers["ompi"]["why"] = f"mpirun --version failed: {tail(r['stderr'], 3)}"
    if not os.path.isfile(python):
        peers["gloo"] = {"ok": False, "why": f"{python} not found"}
    elif not tools["chorus_run"]:
        peers["gloo"] = {"ok": False, "why": "chorus-run (the launcher used for Gloo) not built"}
    else:
        r = run_cmd([python, "-c", "import torch, torch.distributed as d; "
                     "print(torch.__version__, d.is_available() and d.is_gloo_available())"], 120)
        words = r["stdout"].split()
        if r["status"] != "ok" or len(words) < 2 or words[1] != "True":
            peers["gloo"] = {"ok": False, "why": "torch with Gloo not importable by " + python + ": "
                             + (tail(r["stderr"], 2) or r["stdout"].strip())}
        else:
            peers["gloo"] = {"ok": True, "version": "torch " + words[0]}
    if "ucx" in transports:
        if peers["chorus"]["ok"]:
            names = chorus_registered_transports(tools["chorus_info"]) if tools["chorus_info"] else None
            if names is None:
                # Unknown without chorus-info: try; the transport check and the jobs will tell.
                peers["chorus"]["ucx_why"] = "chorus-info not built or failed: not checked"
            else:
                peers["chorus"]["transports"] = names
                peers["chorus"]["ucx"] = "ucx" in names
                if "ucx" not in names:
                    peers["chorus"]["ucx_why"] = ("this build has no ucx transport (chorus-info "
                                                  "lists " + ", ".join(names) + "; UCX not found "
                                                  "by CMake?)")
        if peers["ompi"]["ok"]:
            oi = shutil.which("ompi_info")
            r = run_cmd([oi], 60) if oi else None
            if r and r["status"] == "ok":
                peers["ompi"]["ucx"] = "MCA pml: ucx" in r["stdout"]
                if not peers["ompi"]["ucx"]:
                    peers["ompi"]["ucx_why"] = "ompi_info lists no pml ucx component"
            else:
                peers["ompi"]["ucx_why"] = "ompi_info not found or failed: not checked"
    return peers


def machine_info():
    info = {"hostname": socket.gethostname(), "kernel": platform.release(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_total"] = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    r = run_cmd(["git", "-C", REPO, "rev-parse", "HEAD"], 30)
    info["git_sha"] = r["stdout"].strip() if r["status"] == "ok" else "?"
    r = run_cmd(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"], 30)
    info["git_dirty"] = bool(r["stdout"].strip()) if r["status"] == "ok" else None
    return info


# ------------------------------------------------------------------------------------------
# Jobs


def plan_jobs(args, bands, peers):
    """The list of jobs in execution order: libraries interleaved per band, so that a slow or
    noisy spell of the machine hits every library alike."""
    jobs = []
    for rep in range(args.reps):
        for nranks in args.ranks:
            for transport in args.transports:
                for band in bands:
                    if rep > 0 and nranks != 2 and band["name"] != "A":
                        continue
                    colls = list(COLLS)
                    if rep > 0 and band["name"] == "A":
                        colls = ["allreduce"]  # only the 8-B latency is a target there
                    if rep > 0 and nranks != 2 and transport != "shm":
                        continue  # 4 ranks: only the shm 8-B latency is a target
                    for lib in LIBS:
                        if lib not in args.peers or not peers[lib]["ok"]:
                            continue
                        if lib == "gloo" and transport != "tcp":
                            continue  # Gloo has no shared-memory transport (nor UCX)
                        if transport == "ucx" and peers[lib].get("ucx") is False:
                            continue  # this library cannot run over UCX here (logged)
                        if lib == "chorus":
                            for c in colls:
                                jobs.append({"lib": lib, "transport": transport, "nranks": nranks,
                                             "band": band, "rep": rep, "colls": [c]})
                        else:
                            jobs.append({"lib": lib, "transport": transport, "nranks": nranks,
                                         "band": band, "rep": rep, "colls": colls})
    return jobs


def checked(job, args):
    """-c 1 (verify every size once) in the first repetition of band A (the large sizes would
    cost as much again to check), or everywhere with --check all."""
    return args.check == "all" or (args.check == "first" and job["rep"] == 0
                                   and job["band"]["e"] <= 16 * MiB)


def estimate_job(job, check=True):
    lat, bw = MODEL[(job["lib"], job["transport"], job["nranks"])]
    band = job["band"]
    placements = 2 if job["lib"] == "chorus" else 1  # Chorus's tools also time in place
    start = STARTUP.get((job["lib"], job["transport"]), STARTUP[job["lib"]])
    total = start * len(job["colls"]) if job["lib"] == "chorus" else start
    for _ in job["colls"]:
        sizes = band_sizes(band)
        for s in sizes:
            total += (band["n"] + 1) * placements * (lat + s / bw)
            if check:
                total += s * CHECK_COST[job["lib"]] * job["nranks"] / 2
        total += band["w"] * (2 * lat + (sizes[-1] + sizes[0]) / bw)
    return total


def ucx_env(args):
    """The UCX settings both libraries get over "ucx": ["UCX_TLS=...", "UCX_NET_DEVICES=..."]."""
    return ["UCX_TLS=" + args.ucx_tls, "UCX_NET_DEVICES=" + args.ucx_net_devices]


def chorus_env_for(transport):
    """The environment for chorus-run. chorus-run appends its -x settings to the inherited
    environment, and getenv() returns the first of duplicate entries, so an inherited
    CHORUS_TRANSPORT (or, over ucx, UCX_TLS / UCX_NET_DEVICES) would beat the -x that this
    script passes: those are removed, so that the -x values apply."""
    env = dict(os.environ)
    for name in ["CHORUS_TRANSPORT"] + (["UCX_TLS", "UCX_NET_DEVICES"] if transport == "ucx" else []):
        env.pop(name, None)
    return env


def chorus_transport_args(transport, args):
    """chorus-run options that select `transport` for Chorus's ranks."""
    out = ["-x", "CHORUS_TRANSPORT=" + transport.upper()]
    if transport == "ucx":
        out += [a for kv in ucx_env(args) for a in ("-x", kv)]
    return out


def ompi_transport_args(transport, args):
    """mpirun options that select `transport` for Open MPI: ob1 with the vader or tcp btl, or pml
    ucx. Debian's /etc/openmpi/openmpi-mca-params.conf disables pml ucx (`pml = ^ucx`); the
    command line overrides it. pml_ucx_tls / pml_ucx_devices default to InfiniBand transports and
    mlx* devices, with which the component refuses to load on this host: "any" lets UCX_TLS /
    UCX_NET_DEVICES decide. A forced pml that cannot load makes MPI_Init fail (no fallback to
    ob1), and verify_ompi_ucx() checks what was selected. The btls are left alone (ob1 is not
    used; the benchmark creates no MPI windows, so osc does not matter)."""
    if transport == "shm":
        return ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
    if transport == "tcp":
        return ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
                "--mca", "btl_tcp_if_include", args.tcp_if]
    return (["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]
            + [a for kv in ucx_env(args) for a in ("-x", kv)])


def job_cmd(job, tools, args, raw_dir, tag):
    band = job["band"]
    common = ["-b", str(band["b"]), "-e", str(band["e"]), "-f", str(band["f"]),
              "-n", str(band["n"]), "-w", str(band["w"])]
    check = "1" if checked(job, args) else "0"
    jpath = os.path.join(raw_dir, tag + ".json")
    env = dict(os.environ)
    timeout = max(120.0, min(args.max_job_timeout, 8 * estimate_job(job, checked(job, args)) + 60))
    if job["lib"] == "chorus":
        env = chorus_env_for(job["transport"])
        c = job["colls"][0]
        extra = [a for kv in args.chorus_env for a in ("-x", kv)]
        cmd = [tools["chorus_run"], "-n", str(job["nranks"]), "--timeout", str(int(timeout))] + \
            chorus_transport_args(job["transport"], args) + extra + [
               tools["perf"][c]] + common + ["-z", "1", "-c", check, "-J", jpath] + (
               ["-R", "1"] if args.chorus_register else [])
    elif job["lib"] == "ompi":
        over = ["--oversubscribe"] if job["nranks"] > (os.cpu_count() or 1) else []
        cmd = ["mpirun", "-np", str(job["nranks"]), "--bind-to", args.ompi_bind] + over + \
            ompi_transport_args(job["transport"], args) + [tools["mpi_bench"]] + common + [
               "-c", check, "-o", ",".join(job["colls"]), "-J", jpath]
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "OMPI_MCA_btl_base_warn_component_unused": "0"})
    else:
        cmd = [tools["chorus_run"], "-n", str(job["nranks"]), "--timeout", str(int(timeout)),
               args.python, tools["gloo_bench"]] + common + [
               "-c", check, "-o", ",".join(job["colls"]), "-J", jpath,
               "--timeout", str(int(timeout))]
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                    "GLOO_SOCKET_IFNAME": args.tcp_if})
    return cmd, env, jpath, timeout + 30


def parse_job_json(job, jpath):
    """Normalised rows [{collective, size, count, time_us, busbw, algbw, nwrong, ...}]."""
    with open(jpath) as f:
        doc = json.load(f)
    rows = []
    if job["lib"] == "chorus":
        for r in doc.get("results", []):
            o, i = r["out_of_place"], r.get("in_place", {})
            rows.append({"collective": job["colls"][0], "size": r["size"], "count": r["count"],
                         "time_us": o["time"], "algbw": o["alg_bw"], "busbw": o["bus_bw"],
                         "nwrong": o.get("nwrong"), "in_place_time_us": i.get("time"),
                         "in_place_busbw": i.get("bus_bw")})
        extra = {"library": doc.get("library"), "errors": doc.get("errors", [])}
    else:
        for r in doc.get("results", []):
            rows.append({k: r.get(k) for k in ("collective", "size", "count", "time_us",
                                               "time_max_us", "algbw", "busbw", "nwrong")})
        extra = {"library": doc.get("library"), "unsupported": doc.get("unsupported", {}),
                 "apis": doc.get("apis")}
    return rows, extra


def run_jobs(jobs, tools, args, raw_dir, state, save):
    t_start = time.monotonic()
    est_left = sum(estimate_job(j, checked(j, args)) for j in jobs)
    for k, job in enumerate(jobs):
        band = job["band"]
        tag = (f"{job['lib']}_{job['transport']}_n{job['nranks']}_{band['name']}_"
               f"{'-'.join(job['colls']) if len(job['colls']) == 1 else 'all'}_r{job['rep']}")
        cmd, env, jpath, timeout = job_cmd(job, tools, args, raw_dir, tag)
        if os.path.exists(jpath):
            os.remove(jpath)
        est = estimate_job(job, checked(job, args))
        waited = 0.0
        if args.wait_quiet > 0:
            while waited < args.wait_quiet:
                fl = foreign_load(1.0)
                waited += 1.0
                if fl is None or fl < 0.3:
                    break
        load_before = os.getloadavg()[0]
        r = run_cmd(cmd, timeout, env=env, log_path=os.path.join(raw_dir, tag + ".log"))
        entry = {"lib": job["lib"], "transport": job["transport"], "nranks": job["nranks"],
                 "band": band["name"], "rep": job["rep"], "colls": job["colls"],
                 "iters": band["n"], "warmup": band["w"], "cmd": cmd, "rc": r["rc"],
                 "status": r["status"], "elapsed_s": r["elapsed_s"], "estimate_s": round(est, 1),
                 "loadavg_1min_before": round(load_before, 2),
                 "foreign_cores": r.get("foreign_cores"), "waited_quiet_s": waited, "rows": []}
        if "MASTER_PORT" in env and job["lib"] == "gloo":
            entry["env"] = {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")}
        if job["transport"] == "ucx":
            entry["ucx_tls"], entry["ucx_net_devices"] = args.ucx_tls, args.ucx_net_devices
        if r["status"] == "ok" or os.path.exists(jpath):
            try:
                entry["rows"], extra = parse_job_json(job, jpath)
                entry.update(extra)
            except (OSError, ValueError, KeyError, TypeError) as e:
                if r["status"] == "ok":
                    entry["status"] = "failed"
                    r["error"] = f"no usable JSON output ({type(e).__name__}: {e})"
        if any((row.get("nwrong") or 0) > 0 for row in entry["rows"]):
            entry["status"] = "wrong"
            r["error"] = "#wrong > 0 (results incorrect)"
        if entry["status"] != "ok":
            entry["error"] = r.get("error", "")
            entry["stderr_tail"] = tail(r["stderr"]) or tail(r["stdout"])
            entry["stdout_tail"] = tail(r["stdout"], 8)
        state["runs"].append(entry)
        est_left -= est
        elapsed = time.monotonic() - t_start
        mark = "ok" if entry["status"] == "ok" else entry["status"].upper()
        fc = r.get("foreign_cores")
        log(f"[{k + 1:3d}/{len(jobs)}] {tag:<46} {r['elapsed_s']:7.1f} s (est {est:5.1f}) {mark}"
            f"  other load {'?' if fc is None else f'{fc:.2f}'}"
            f"   elapsed {elapsed / 60:5.1f} min, est. left {est_left / 60:5.1f} min")
        if entry["status"] != "ok":
            log(f"      {entry.get('error', '')}\n      " +
                "\n      ".join(entry.get("stderr_tail", "").splitlines()[-6:]))
        save()


def parse_peers_over(text):
    """'direct 0, shm 0, tcp 0, ucx 3' (or the older 'shm 1') -> {"direct": 0, ..., "ucx": 3}."""
    counts = {}
    for part in text.split(","):
        words = part.split()
        if len(words) == 2 and words[1].isdigit():
            counts[words[0]] = int(words[1])
    return counts


def verify_transports(tools, args, raw_dir, transports=None):
    """Runs a one-size Chorus AllReduce per transport and rank count with CHORUS_DEBUG=INFO and
    reads the peers-per-transport line ("... ready on HOST: peers over direct 0, shm 0, tcp 0,
    ucx 3; ..." — every transport the rank opened, with its peer count), so the report shows
    what CHORUS_TRANSPORT selected. Over ucx it also keeps the UCX settings and endpoint lanes
    that the transport logs ("ucx: UCP context created (UCX_TLS=...)", "ucx: ... -> ...: lane[0]
    ...")."""
    out = {}
    if not tools["chorus_run"] or not tools["perf"]["allreduce"]:
        return out
    for tr in args.transports if transports is None else transports:
        for n in args.ranks:
            tag = f"{tr}_{n}"
            extra = [a for kv in args.chorus_env for a in ("-x", kv)]
            r = run_cmd([tools["chorus_run"], "-n", str(n), "--timeout", "60"] +
                        chorus_transport_args(tr, args) + ["-x", "CHORUS_DEBUG=INFO"] + extra + [
                         tools["perf"]["allreduce"], "-b", "8", "-e", "8", "-n", "1", "-w", "0",
                         "-c", "0"], 90, env=chorus_env_for(tr),
                        log_path=os.path.join(raw_dir, f"transport_{tag}.log"))
            text = r["stdout"] + r["stderr"]
            lines = [l for l in text.splitlines() if "peers over" in l]
            counts = [l.split("peers over", 1)[1].split(";")[0].strip() for l in lines]
            # Every rank reached all n-1 peers over the transport asked for.
            ok = r["status"] == "ok" and len(counts) == n and all(
                parse_peers_over(c).get(tr) == n - 1 for c in counts)
            out[tag] = {"ok": ok, "peers_over": counts[:1][0] if counts else None,
                        "status": r["status"], "stderr_tail": None if ok else tail(r["stderr"], 5)}
            if tr == "ucx":
                ctx = [" ".join(l.split("ucx: ", 1)[1].split()) for l in text.splitlines()
                       if "ucx: UCP context created" in l]
                lanes = [" ".join(l.split("ucx: ", 1)[1].split()) for l in text.splitlines()
                         if "ucx: " in l and " -> " in l and "lane[" in l]
                out[tag].update({"ucx_tls": args.ucx_tls, "ucx_net_devices": args.ucx_net_devices,
                                 "ucx_context": ctx[:1][0] if ctx else None,
                                 "ucx_lanes": lanes[:1][0] if lanes else None})
    return out


def verify_ompi_ucx(tools, args, raw_dir):
    """Open MPI over ucx: runs a one-size MPI_Allreduce per rank count with the job's options plus
    --mca pml_base_verbose 10 (each rank logs "select: component ucx selected") and
    UCX_LOG_LEVEL=info (UCX logs each endpoint configuration: "ep_cfg[1]: tag(tcp/lo)"), so the
    report shows that pml ucx really ran and over which UCX transports."""
    out = {}
    if not tools["mpi_bench"]:
        return out
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_base_warn_component_unused="0")
    for n in args.ranks:
        over = ["--oversubscribe"] if n > (os.cpu_count() or 1) else []
        r = run_cmd(["mpirun", "-np", str(n), "--bind-to", args.ompi_bind] + over +
                    ompi_transport_args("ucx", args) +
                    ["--mca", "pml_base_verbose", "10", "-x", "UCX_LOG_LEVEL=info",
                     tools["mpi_bench"], "-b", "8", "-e", "8", "-n", "1", "-w", "0", "-c", "1",
                     "-o", "allreduce"], 120, env=env,
                    log_path=os.path.join(raw_dir, f"ompi_transport_ucx_{n}.log"))
        text = r["stdout"] + r["stderr"]
        selected = [l.split("select: component", 1)[1].split()[0] for l in text.splitlines()
                    if "select: component" in l and l.rstrip().endswith("selected")]
        cfgs = sorted({l.split("ep_cfg[", 1)[1].split(":", 1)[1].strip() for l in text.splitlines()
                       if "ep_cfg[" in l and ":" in l.split("ep_cfg[", 1)[1]})
        ok = r["status"] == "ok" and len(selected) == n and all(c == "ucx" for c in selected)
        out[f"ucx_{n}"] = {"ok": ok, "pml_selected": sorted(set(selected)),
                           "ranks_selected": len(selected), "ucx_ep_configs": cfgs,
                           "ucx_tls": args.ucx_tls, "ucx_net_devices": args.ucx_net_devices,
                           "status": r["status"],
                           "stderr_tail": None if ok else tail(r["stderr"], 5)}
    return out


def run_limits(tools, args, raw_dir, which):
    out = {}
    if tools["memcpy_bw"]:
        p = os.path.join(raw_dir, f"memcpy_{which}.json")
        r = run_cmd([tools["memcpy_bw"], "-s", "128", "-r", "3" if args.quick else "7", "-t", "2",
                     "-J", p], 300, log_path=os.path.join(raw_dir, f"memcpy_{which}.log"))
        if r["status"] == "ok":
            with open(p) as f:
                out["memcpy"] = json.load(f)
        else:
            out["memcpy"] = {"error": r.get("error"), "stderr_tail": tail(r["stderr"])}
    else:
        out["memcpy"] = {"error": "chorus_memcpy_bw not built"}
    if tools["tcp_bw"]:
        p = os.path.join(raw_dir, f"tcp_{which}.json")
        r = run_cmd([tools["tcp_bw"], "-s", str(1 << 30), "-r", "1" if args.quick else "3",
                     "-J", p], 300, log_path=os.path.join(raw_dir, f"tcp_{which}.log"))
        if r["status"] == "ok":
            with open(p) as f:
                out["tcp"] = json.load(f)
        else:
            out["tcp"] = {"error": r.get("error"), "stderr_tail": tail(r["stderr"])}
    else:
        out["tcp"] = {"error": "chorus_tcp_bw not built"}
    return out


# ------------------------------------------------------------------------------------------
# Analysis


def collect(state):
    """{(lib, transport, nranks, coll, size): [rows over repetitions]}"""
    table = {}
    for run in state["runs"]:
        if run["status"] not in ("ok",):
            continue
        for row in run["rows"]:
            key = (run["lib"], run["transport"], run["nranks"], row["collective"], row["size"])
            table.setdefault(key, []).append(dict(row, rep=run["rep"]))
    return table


def summarize(rows):
    """Median over repetitions: the median time and the busbw it gives (busbw = K / time)."""
    times = [r["time_us"] for r in rows if r.get("time_us")]
    if not times:
        return None
    t = statistics.median(times)
    k = rows[0]["busbw"] * rows[0]["time_us"]
    ka = rows[0]["algbw"] * rows[0]["time_us"]
    return {"time_us": t, "busbw": k / t, "algbw": ka / t, "n": len(times),
            "busbw_min": k / max(times), "busbw_max": k / min(times),
            "time_min": min(times), "time_max": max(times),
            "by_rep": {r["rep"]: r["time_us"] for r in rows if r.get("time_us")}}


def paired(c, p):
    """Chorus/peer busbw ratios of the repetitions both measured (run back to back)."""
    if not c or not p:
        return []
    return [p["by_rep"][k] / c["by_rep"][k] for k in sorted(c["by_rep"]) if k in p["by_rep"]]


def limits_summary(state):
    """Best over the start and end measurements: the machine's capability."""
    lim = {"mem_copy_2t": None, "mem_copy_1t": None, "mem_triad_2t": None,
           "tcp_one_way": None, "tcp_both": None}
    for m in state["limits"].values():
        for r in m.get("memcpy", {}).get("results", []) or []:
            key = "mem_copy_2t" if r["threads"] == 2 else "mem_copy_1t" if r["threads"] == 1 else None
            if key:
                lim[key] = max(lim[key] or 0, r["copy_gbps_best"])
            if r["threads"] == 2:
                lim["mem_triad_2t"] = max(lim["mem_triad_2t"] or 0, r["triad_gbps_best"])
        t = m.get("tcp", {})
        if "one_way_gbps_best" in t:
            lim["tcp_one_way"] = max(lim["tcp_one_way"] or 0, t["one_way_gbps_best"])
            lim["tcp_both"] = max(lim["tcp_both"] or 0, t["both_ways_gbps_best"])
    if lim["mem_copy_2t"]:
        lim["mem_traffic_B"] = 2 * lim["mem_copy_2t"]  # read + write
    return lim


# Minimal memory traffic per call, in units of the size S (the size column), for 2 ranks
# that share memory, if each input byte is read once and each output byte written once:
#   allreduce 2 inputs read + 2 outputs written = 4S -> algbw <= B/4, busbw = algbw
#   reduce_scatter 2S read + 2*(S/2) written = 3S   -> algbw <= B/3, busbw = algbw/2
#   allgather 2*(S/2) read + 2S written = 3S        -> algbw <= B/3, busbw = algbw/2
#   alltoall 2S read + 2S written = 4S              -> algbw <= B/4, busbw = algbw/2
#   bcast S read + 2S written (out of place) = 3S   -> algbw <= B/3, busbw = algbw
MEM_TRAFFIC = {"allreduce": 4, "reduce_scatter": 3, "allgather": 3, "alltoall": 4, "bcast": 3}
BUS_FACTOR_2 = {"allreduce": 1.0, "reduce_scatter": 0.5, "allgather": 0.5, "alltoall": 0.5,
                "bcast": 1.0}


def mem_bound_busbw(coll, lim):
    if not lim.get("mem_traffic_B"):
        return None
    return lim["mem_traffic_B"] / MEM_TRAFFIC[coll] * BUS_FACTOR_2[coll]


def tcp_bound_busbw(coll, lim):
    """busbw is the bytes one rank sends per second (for 2 ranks); both directions are loaded
    at once except in Broadcast, so the bound is the per-direction bidirectional throughput."""
    if coll == "bcast":
        return lim.get("tcp_one_way")
    return lim["tcp_both"] / 2 if lim.get("tcp_both") else None


def evaluate_targets(med, lim):
    def get(lib, tr, n, coll, size):
        return med.get((lib, tr, n, coll, size))

    targets = []

    def ratio_target(name, tr, n, coll, sizes, factor, peer="ompi", peer_tr=None, bound=None):
        """Chorus over `tr` against `peer` over `peer_tr` (default: the same transport). With
        `bound` (GB/s), sizes where `factor` x the peer's busbw exceeds it are marked."""
        peer_tr = peer_tr or tr
        vals, verdict, worst = [], "PASS", None
        measured = [s for s in sizes if any(k[1:] == (tr, n, coll, s) for k in med)]
        if not measured:
            targets.append({"target": name, "verdict": "N/A", "worst_ratio": None,
                            "detail": "no measurement at " + ", ".join(fmt_size(s) for s in sizes)})
            return
        for s in measured:
            c, p = get("chorus", tr, n, coll, s), get(peer, peer_tr, n, coll, s)
            if not c or not p:
                verdict = "N/A" if verdict != "FAIL" else verdict
                vals.append(f"{fmt_size(s)}: missing")
                continue
            r = c["busbw"] / p["busbw"]
            pr = paired(c, p)
            rng = f" [{min(pr):.2f}–{max(pr):.2f}]" if len(pr) > 1 else ""
            beyond = ""
            if bound and factor * p["busbw"] > bound:
                beyond = (f" ({factor:g}x the peer = {factor * p['busbw']:.2f} GB/s is beyond the "
                          f"bound, {bound:.2f})")
            vals.append(f"{fmt_size(s)}: {c['busbw']:.3f} vs {p['busbw']:.3f} GB/s = {r:.2f}x{rng}"
                        f"{beyond}")
            if worst is None or r < worst:
                worst = r
            if r < factor:
                verdict = "FAIL"
        targets.append({"target": name, "verdict": verdict, "worst_ratio": worst,
                        "detail": "; ".join(vals)})

    def latency_target(name, tr, n, coll, size, limit_us=None, peer=None, factor=1.0):
        c = get("chorus", tr, n, coll, size)
        p = get(peer, tr, n, coll, size) if peer else None
        if not c or (peer and not p):
            targets.append({"target": name, "verdict": "N/A",
                            "detail": "missing: " + ("Chorus" if not c else LIB_TITLE[peer])})
            return
        if peer:
            r = p["time_us"] / c["time_us"]
            ok = r >= factor
            pr = paired(c, p)
            rng = f" [per repetition {min(pr):.2f}–{max(pr):.2f}]" if len(pr) > 1 else ""
            detail = (f"Chorus {c['time_us']:.2f} us vs {LIB_TITLE[peer]} {p['time_us']:.2f} us: "
                      f"Chorus {r:.2f}x {'faster' if r >= 1 else 'of its speed'}{rng} "
                      f"(need >= {factor:g}x)")
            targets.append({"target": name, "verdict": "PASS" if ok else "FAIL",
                            "worst_ratio": r, "detail": detail})
        else:
            ok = c["time_us"] <= limit_us
            rng = f" [{c['time_min']:.2f}–{c['time_max']:.2f}]" if c["n"] > 1 else ""
            targets.append({"target": name, "verdict": "PASS" if ok else "FAIL",
                            "detail": f"Chorus {c['time_us']:.2f} us{rng} (limit {limit_us} us)"})

    big = [MiB << k for k in range(0, 8)]  # 1 MiB .. 128 MiB
    ratio_target("shm AllReduce busbw >= 2x OMPI at 16 MiB", "shm", 2, "allreduce", [16 * MiB], 2)
    ratio_target("shm AllReduce busbw >= 2x OMPI at 128 MiB", "shm", 2, "allreduce", [128 * MiB], 2)
    ratio_target("shm AllReduce busbw >= 1x OMPI at 1 MiB", "shm", 2, "allreduce", [MiB], 1)
    ratio_target("shm ReduceScatter busbw >= 3x OMPI at 16 MiB and above", "shm", 2,
                 "reduce_scatter", [s for s in big if s >= 16 * MiB], 3)
    for coll in ("allgather", "alltoall", "bcast"):
        ratio_target(f"shm {COLL_TITLE[coll]} busbw >= 1x OMPI at 1 MiB and above", "shm", 2,
                     coll, big, 1)
    latency_target("shm AllReduce 8-B latency <= 1.5 us (2 ranks)", "shm", 2, "allreduce", 8,
                   limit_us=1.5)
    latency_target("shm AllReduce 8-B latency no worse than OMPI (4 ranks)", "shm", 4,
                   "allreduce", 8, peer="ompi")
    ratio_target("TCP AllReduce busbw >= 1.5x OMPI at 128 MiB", "tcp", 2, "allreduce",
                 [128 * MiB], 1.5)
    latency_target("TCP AllReduce 8-B latency no worse than OMPI", "tcp", 2, "allreduce", 8,
                   peer="ompi")
    for coll in ("allreduce", "reduce_scatter", "allgather", "alltoall", "bcast"):
        if not any(get("gloo", "tcp", 2, coll, s) for s in big):
            targets.append({"target": f"Gloo: TCP {COLL_TITLE[coll]} busbw >= 3x Gloo from 1 MiB",
                            "verdict": "N/A", "detail": "Gloo (torch 1.13) does not support it"
                            if coll == "reduce_scatter" else "no Gloo data"})
            continue
        ratio_target(f"Gloo: TCP {COLL_TITLE[coll]} busbw >= 3x Gloo from 1 MiB", "tcp", 2, coll,
                     big, 3, peer="gloo", bound=tcp_bound_busbw(coll, lim))
    # Gloo has no shared-memory transport: on one host its users get TCP loopback, Chorus's get
    # shared memory. The same targets, each library on its own default transport:
    for coll in ("allreduce", "allgather", "alltoall", "bcast"):
        if any(get("gloo", "tcp", 2, coll, s) for s in big):
            ratio_target(f"(extra) Gloo, one host, default transports (Chorus shm, Gloo TCP): "
                         f"{COLL_TITLE[coll]} busbw >= 3x Gloo from 1 MiB", "shm", 2, coll, big, 3,
                         peer="gloo", peer_tr="tcp")
            targets[-1]["extra"] = True
    latency_target("Gloo: TCP AllReduce 8-B latency >= 50x lower than Gloo", "tcp", 2,
                   "allreduce", 8, peer="gloo", factor=50)
    c = med.get(("chorus", "shm", 2, "allreduce", 128 * MiB))
    bound = mem_bound_busbw("allreduce", lim)
    if c and bound:
        f = c["busbw"] / bound
        targets.append({"target": "shm AllReduce busbw at 128 MiB >= 0.5 x memory-bandwidth bound",
                        "verdict": "PASS" if f >= 0.5 else "FAIL", "worst_ratio": f,
                        "detail": f"{c['busbw']:.3f} GB/s vs bound {bound:.3f} GB/s = {f:.2f}"})
    else:
        targets.append({"target": "shm AllReduce busbw at 128 MiB >= 0.5 x memory-bandwidth bound",
                        "verdict": "N/A", "detail": "missing Chorus result or memcpy measurement"})
    return targets


# ------------------------------------------------------------------------------------------
# Report


def f3(x):
    return "—" if x is None else f"{x:.3f}"


def fr(x):
    return "—" if x is None else f"{x:.2f}"


def write_report(state, out_dir, plots):
    med = {k: summarize(v) for k, v in collect(state).items()}
    med = {k: v for k, v in med.items() if v}
    lim = limits_summary(state)
    targets = evaluate_targets(med, lim)
    state["targets"] = targets
    state["limits_summary"] = lim
    meta = state["meta"]
    L = []
    L.append("# Chorus vs Open MPI vs Gloo — host-memory collectives\n")
    L.append(f"Generated by `bench/compare/compare.py` on {meta['started']} "
             f"({'quick sweep' if meta['quick'] else 'full sweep'}), runtime "
             f"{meta.get('runtime_s', 0) / 60:.1f} min. Command: `{meta['command']}`\n")
    m = meta["machine"]
    L.append(f"Machine: {m.get('cpu', '?')}, {m.get('cpus')} CPUs, {m.get('mem_total', '?')} RAM, "
             f"Linux {m.get('kernel')}; working tree at git {m.get('git_sha', '?')[:12]}"
             f"{' (+ uncommitted changes)' if m.get('git_dirty') else ''}.")
    libs = {}
    for r in state["runs"]:
        if r.get("library") and r["lib"] not in libs:
            libs[r["lib"]] = r["library"]
    if libs:
        L.append("Libraries as the benchmarks report them: " +
                 "; ".join(f"{LIB_TITLE[k]}: `{v}`" for k, v in libs.items()) + ".")
    pv = meta["peers"]
    L.append("Peers: " + "; ".join(
        f"{LIB_TITLE[k]}: " + (v.get("version", "ok") if v["ok"] else "MISSING — " + v["why"])
        for k, v in pv.items()) + ".\n")
    if meta.get("chorus_register"):
        L.append("Chorus's buffers: ncclMemAlloc memory registered with ncclCommRegister "
                 "(`-R 1`); the peers' buffers are plain memory.\n")
    if meta.get("chorus_env"):
        L.append("Chorus ran with extra environment: " +
                 ", ".join(f"`{kv}`" for kv in meta["chorus_env"]) + ".\n")
    L.append("Method: every number is the out-of-place time per call (nccl-tests' `-a 1`: the "
             "mean over ranks of elapsed/-n), busbw with nccl-tests' factors, GB = 1e9 B. "
             f"Median over {meta['reps']} repetition(s) in this run at 2 ranks (all sizes from "
             f"{fmt_size(meta['bands'][-1]['b'])}; below that only AllReduce repeats) and for the "
             "4-rank shm small-size AllReduce; one measurement elsewhere. Sizes from "
             f"{fmt_size(meta['bands'][-1]['b'])} are one sweep with buffers of "
             f"{fmt_size(meta['bands'][-1]['e'])} (so each size's cache footprint is that of a "
             "single nccl-tests sweep); smaller sizes are a separate run with more iterations. "
             f"Results verified (-c 1): {meta.get('check', 'first')} "
             "(first = the first repetition of the small sizes). "
             "Transports: shm = Chorus `CHORUS_TRANSPORT=SHM` / Open MPI `--mca pml ob1 --mca btl "
             "self,vader`; tcp = Chorus `CHORUS_TRANSPORT=TCP` / Open MPI `--mca btl self,tcp "
             f"--mca btl_tcp_if_include {meta['tcp_if']}` / Gloo (TCP over loopback, "
             f"`GLOO_SOCKET_IFNAME={meta['tcp_if']}`; Gloo has no shm transport, so its column "
             "is in the tcp tables only). 4 ranks on this host's "
             f"{m.get('cpus')} cores are oversubscribed. Gloo's AllReduce and Broadcast are "
             "torch's in-place calls; Gloo in torch 1.13 has no ReduceScatter. Iterations per size "
             "band: " + ", ".join(f"{fmt_size(b['b'])}–{fmt_size(b['e'])} -n {b['n']} -w {b['w']}"
                                  for b in meta["bands"]) + ".\n")

    fc = [r["foreign_cores"] for r in state["runs"] if r.get("foreign_cores") is not None]
    if fc:
        busy = sum(x > 0.5 for x in fc)
        L.append(f"Noise: other processes on this machine used a median {statistics.median(fc):.2f} "
                 f"and at most {max(fc):.2f} of its {m.get('cpus')} cores during the jobs; {busy} of "
                 f"{len(fc)} jobs ran while they used more than half a core (per-job figures: "
                 "`foreign_cores` in results.json).\n")
    ct = meta.get("chorus_transports") or {}
    if ct:
        L.append("Chorus's transport, as its CHORUS_DEBUG=INFO init line reports it (rank 0): " +
                 "; ".join(f"{k.replace('_', ', ')} ranks: peers over {v['peers_over']}"
                           + ("" if v["ok"] else " (UNEXPECTED)") for k, v in ct.items()) + ".\n")
    L.append("## Targets (2 ranks unless stated; medians)\n")
    L.append("Ratio x = Chorus / peer of the median busbw (or peer time / Chorus time for "
             "latency); in brackets the range of the per-repetition ratios.\n")
    L.append("| Target | Verdict | Measured |")
    L.append("|---|---|---|")
    for t in targets:
        L.append(f"| {t['target']} | **{t['verdict']}** | {t['detail']} |")
    issue = [t for t in targets if not t.get("extra")]
    npass = sum(t["verdict"] == "PASS" for t in issue)
    nextra = len(targets) - len(issue)
    L.append(f"\n{npass} of {len(issue)} targets pass" + (
        f" (the {nextra} rows marked (extra) are not counted: they compare each library on its "
        f"own default transport on one host)" if nextra else "") + ".\n")

    L.append("## Machine limits (measured in this run, best of start and end)\n")
    L.append("| Quantity | Value |")
    L.append("|---|---|")
    L.append(f"| memcpy, 1 thread, bytes copied/s | {f3(lim['mem_copy_1t'])} GB/s |")
    L.append(f"| memcpy, 2 threads, bytes copied/s (aggregate) | {f3(lim['mem_copy_2t'])} GB/s |")
    L.append(f"| memory traffic B = 2 x that (read + write) | {f3(lim.get('mem_traffic_B'))} GB/s |")
    L.append(f"| triad a=b+3c, 2 threads, bytes of traffic/s | {f3(lim['mem_triad_2t'])} GB/s |")
    L.append(f"| TCP loopback, one way | {f3(lim['tcp_one_way'])} GB/s |")
    L.append(f"| TCP loopback, both ways at once (sum) | {f3(lim['tcp_both'])} GB/s |")
    L.append("")
    L.append("Bounds for 2 ranks (busbw, GB/s). Memory: an out-of-place call must at least read "
             "every input byte once and write every output byte once; an AllReduce of S-byte "
             "buffers on 2 ranks reads 2S and writes 2S = 4S bytes, so algbw = S/t <= B/4, and "
             "busbw = algbw for n = 2. Likewise ReduceScatter and AllGather move 3S (busbw <= "
             "B/6), AlltoAll 4S (busbw <= B/8), Broadcast 3S (busbw <= B/3). TCP: for 2 ranks "
             "busbw is the bytes each rank sends per second, both directions loaded at once, so "
             "busbw <= (both-ways throughput)/2; Broadcast sends one way only, busbw <= one-way "
             "throughput.\n")
    L.append("| Collective | memory bound | TCP bound |")
    L.append("|---|---|---|")
    for c in COLLS:
        L.append(f"| {COLL_TITLE[c]} | {f3(mem_bound_busbw(c, lim))} | {f3(tcp_bound_busbw(c, lim))} |")
    L.append("")

    L.append("### Chorus AllReduce as a fraction of the machine limits (2 ranks)\n")
    L.append("| Size | shm busbw | / memory bound | tcp busbw | / TCP bound |")
    L.append("|---|---|---|---|---|")
    mb, tb = mem_bound_busbw("allreduce", lim), tcp_bound_busbw("allreduce", lim)
    for s in sorted({k[4] for k in med if k[0] == "chorus" and k[3] == "allreduce" and k[2] == 2}):
        if s < MiB:
            continue
        cs, ct = med.get(("chorus", "shm", 2, "allreduce", s)), med.get(("chorus", "tcp", 2, "allreduce", s))
        L.append(f"| {fmt_size(s)} | {f3(cs and cs['busbw'])} | "
                 f"{fr(cs and mb and cs['busbw'] / mb)} | {f3(ct and ct['busbw'])} | "
                 f"{fr(ct and tb and ct['busbw'] / tb)} |")
    L.append("")

    L.append("## Small-message latency (smallest size with an element per rank; time per call, us)\n")
    L.append("| Collective | Transport | Ranks | Size | Chorus | Open MPI | Gloo | OMPI/Chorus | Gloo/Chorus |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for c in COLLS:
        for tr in TRANSPORTS:
            for n in sorted({k[2] for k in med}):
                sizes = sorted({k[4] for k in med if k[1] == tr and k[2] == n and k[3] == c})
                if not sizes:
                    continue
                s = sizes[0]
                ch, om, gl = (med.get((lib, tr, n, c, s)) for lib in LIBS)
                L.append(f"| {COLL_TITLE[c]} | {tr} | {n} | {fmt_size(s)} | "
                         f"{fr(ch and ch['time_us'])} | {fr(om and om['time_us'])} | "
                         f"{fr(gl and gl['time_us'])} | "
                         f"{fr(ch and om and om['time_us'] / ch['time_us'])} | "
                         f"{fr(ch and gl and gl['time_us'] / ch['time_us'])} |")
    L.append("\nRatios above 1 mean Chorus is faster.\n")

    L.append("## Bus bandwidth per collective, transport, ranks and size\n")
    L.append("busbw in GB/s (median); ratios are Chorus busbw / peer busbw (above 1: Chorus is "
             "faster), of the medians; in brackets the lowest and highest Chorus/OMPI ratio of "
             "one repetition (Chorus and Open MPI measured back to back), where there were "
             "several; reps: measurements per library.\n")
    for c in COLLS:
        for tr in TRANSPORTS:
            for n in sorted({k[2] for k in med}):
                sizes = sorted({k[4] for k in med if k[1] == tr and k[2] == n and k[3] == c})
                if not sizes:
                    continue
                gl_col = tr == "tcp"
                L.append(f"### {COLL_TITLE[c]}, {tr}, {n} ranks\n")
                hdr = "| Size | Chorus | Open MPI |" + (" Gloo |" if gl_col else "") + \
                      " Chorus/OMPI |" + (" Chorus/Gloo |" if gl_col else "") + " reps |"
                L.append(hdr)
                L.append("|" + "---|" * (hdr.count("|") - 1))
                for s in sizes:
                    ch, om, gl = (med.get((lib, tr, n, c, s)) for lib in LIBS)
                    rng = ""
                    pr = paired(ch, om)
                    if len(pr) > 1:
                        rng = f" [{min(pr):.2f}–{max(pr):.2f}]"
                    row = f"| {fmt_size(s)} | {f3(ch and ch['busbw'])} | {f3(om and om['busbw'])} |"
                    if gl_col:
                        row += f" {f3(gl and gl['busbw'])} |"
                    row += f" {fr(ch and om and ch['busbw'] / om['busbw'])}{rng} |"
                    if gl_col:
                        row += f" {fr(ch and gl and ch['busbw'] / gl['busbw'])} |"
                    row += f" {ch['n'] if ch else 0}/{om['n'] if om else 0}" + \
                           (f"/{gl['n'] if gl else 0}" if gl_col else "") + " |"
                    L.append(row)
                L.append("")

    L.extend(ucx_section(state, med, lim))

    bad = [r for r in state["runs"] if r["status"] != "ok"]
    unsup = {}
    for r in state["runs"]:
        for k, v in (r.get("unsupported") or {}).items():
            unsup[(r["lib"], k)] = v
    L.append("## Failures and unsupported operations\n")
    if not bad and not unsup:
        L.append("None.\n")
    for (lib, c), why in sorted(unsup.items()):
        L.append(f"- {LIB_TITLE[lib]} {COLL_TITLE[c]}: unsupported ({why}).")
    for r in bad:
        L.append(f"- {LIB_TITLE[r['lib']]} {r['transport']} {r['nranks']} ranks band {r['band']} "
                 f"rep {r['rep']} ({', '.join(r['colls'])}): {r['status']} — {r.get('error', '')}\n"
                 "  ```\n  " + "\n  ".join((r.get("stderr_tail") or "").splitlines()[-8:]) + "\n  ```")
    L.append("")
    if plots:
        L.append("## Plots\n")
        for p in plots:
            L.append(f"- [{os.path.basename(p)}]({os.path.basename(p)})")
        L.append("")
    with open(os.path.join(out_dir, "ratios.md"), "w") as f:
        f.write("\n".join(L))
    return med, lim


# The UCX comparison (--transports ucx): Chorus and Open MPI both over UCX. Not an issue 3
# target: a section of its own, after the shm/tcp tables.
UCX_BIG = [MiB, 16 * MiB, 128 * MiB]  # the sizes whose busbw ratio the summary shows


def ucx_bound_kind(tls):
    """Which machine bound applies to a UCX_TLS list: "tcp" (tcp and self only), "memory" (no
    tcp), or None (both kinds, e.g. tcp,sm,self: peers may use either)."""
    names = {t.strip() for t in (tls or "").split(",") if t.strip()} - {"self"}
    if names and names <= {"tcp"}:
        return "tcp"
    if names and "tcp" not in names:
        return "memory"
    return None


def ucx_summary(med):
    """Rows per (collective, ranks) with data over ucx: the smallest size's latencies and the
    busbw ratio at UCX_BIG. Ratios are Chorus / Open MPI speed (above 1: Chorus is faster)."""
    rows = []
    for c in COLLS:
        for n in sorted({k[2] for k in med if k[1] == "ucx"}):
            sizes = sorted({k[4] for k in med if k[1] == "ucx" and k[2] == n and k[3] == c})
            if not sizes:
                continue
            s0 = sizes[0]
            ch, om = med.get(("chorus", "ucx", n, c, s0)), med.get(("ompi", "ucx", n, c, s0))
            row = {"coll": c, "nranks": n, "small": s0, "chorus_us": ch and ch["time_us"],
                   "ompi_us": om and om["time_us"],
                   "lat_ratio": ch and om and om["time_us"] / ch["time_us"], "big": {}}
            for s in UCX_BIG:
                ch, om = med.get(("chorus", "ucx", n, c, s)), med.get(("ompi", "ucx", n, c, s))
                if ch or om:
                    row["big"][s] = {"chorus": ch and ch["busbw"], "ompi": om and om["busbw"],
                                     "ratio": ch and om and ch["busbw"] / om["busbw"]}
            rows.append(row)
    return rows


def ucx_label(meta):
    return (f"both over UCX (UCX_TLS={meta.get('ucx_tls', '?')}, "
            f"UCX_NET_DEVICES={meta.get('ucx_net_devices', '?')})")


def ucx_summary_table(rows):
    """Markdown lines of the summary table (also printed at the end of a run)."""
    L = ["| Collective | Ranks | Size | Chorus us | Open MPI us | latency OMPI/Chorus | " +
         " | ".join(f"busbw Chorus/OMPI at {fmt_size(s)}" for s in UCX_BIG) + " |",
         "|---|---|---|---|---|---|" + "---|" * len(UCX_BIG)]
    for r in rows:
        big = [r["big"].get(s) for s in UCX_BIG]
        L.append(f"| {COLL_TITLE[r['coll']]} | {r['nranks']} | {fmt_size(r['small'])} | "
                 f"{fr(r['chorus_us'])} | {fr(r['ompi_us'])} | {fr(r['lat_ratio'])} | " +
                 " | ".join("—" if not b else
                            f"{fr(b['ratio'])} ({f3(b['chorus'])} / {f3(b['ompi'])})" for b in big)
                 + " |")
    return L


def ucx_section(state, med, lim):
    """The "Chorus vs Open MPI, both over UCX" section of ratios.md ([] without ucx data)."""
    meta = state["meta"]
    if not any(k[1] == "ucx" for k in med) and "ucx" not in (meta.get("transports") or []):
        return []
    tls = meta.get("ucx_tls", "?")
    L = [f"## UCX: Chorus vs Open MPI, {ucx_label(meta)}\n"]
    L.append("Chorus: `chorus-run -x CHORUS_TRANSPORT=UCX -x UCX_TLS=" + tls + " -x UCX_NET_DEVICES="
             + meta.get("ucx_net_devices", "?") + "` with the same tools as above. Open MPI: `mpirun "
             "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS=" + tls +
             " -x UCX_NET_DEVICES=" + meta.get("ucx_net_devices", "?") + "` (no btl options; "
             "Debian's `pml = ^ucx` default is overridden on the command line). Gloo has no UCX. "
             "Same sizes, bands, repetitions and method as the shm/tcp comparison. **Not counted "
             "toward the issue 3 targets above.**\n")
    ct = {k: v for k, v in (meta.get("chorus_transports") or {}).items() if k.startswith("ucx_")}
    for k, v in ct.items():
        L.append(f"- Chorus, {k.split('_')[1]} ranks: peers over {v.get('peers_over')}"
                 + ("" if v["ok"] else " (UNEXPECTED: not every peer over ucx)")
                 + (f"; {v['ucx_context']}" if v.get("ucx_context") else "")
                 + (f"; first endpoint logged: `{v['ucx_lanes']}`" if v.get("ucx_lanes") else ""))
    for k, v in (meta.get("ompi_transports") or {}).items():
        L.append(f"- Open MPI, {k.split('_')[1]} ranks: pml "
                 f"{', '.join(v['pml_selected']) or 'none'} selected on {v['ranks_selected']} "
                 f"rank(s)" + ("" if v["ok"] else " (UNEXPECTED: not pml ucx on every rank)") +
                 "; UCX endpoint configurations (UCX_LOG_LEVEL=info): " +
                 ("; ".join(f"`{e}`" for e in v["ucx_ep_configs"]) or "none logged"))
    if ct or meta.get("ompi_transports"):
        L.append("")
    if ucx_bound_kind(tls) is None:
        L.append(f"Caveat: with UCX_TLS={tls} the two libraries may not use the same UCX "
                 "transport: UCX 1.13's shared-memory transports cannot do peer-failure handling, "
                 "so endpoints that ask for it (Chorus's) use tcp to same-host peers, while Open "
                 "MPI 4.1's (no error handling) use sysv/cma. Compare the endpoint lines above.\n")
    elif ucx_bound_kind(tls) == "memory":
        L.append(f"Caveat: UCX_TLS={tls} has no tcp. UCX 1.13's shared-memory transports cannot do "
                 "peer-failure handling, so Chorus makes its same-host endpoints without it (core "
                 "watches those peers) and leaves out UCX's single-copy transports (cma aborts a "
                 "process whose peer died): Chorus copies through UCX's posix/sysv FIFOs, while "
                 "Open MPI 4.1 also uses cma (one copy) for large messages. Compare the endpoint "
                 "lines above.\n")
    rows = ucx_summary(med)
    if not rows:
        L.append("No UCX measurements (see Failures).\n")
        return L
    L.append("### Summary\n")
    L.append("Smallest size (8 B for most collectives): time per call and the latency ratio "
             "Open MPI time / Chorus time; large sizes: busbw ratio Chorus / Open MPI (in brackets "
             "the busbw in GB/s, Chorus / Open MPI). Above 1: Chorus is faster.\n")
    L.extend(ucx_summary_table(rows))
    L.append("")
    band_of = {}
    for b in meta.get("bands", []):
        for s in band_sizes(b):
            band_of.setdefault(s, b["name"])
    L.append("### Per size\n")
    L.append("Band A: the small sizes (more iterations); L: the large-size sweep. Chorus/OMPI = "
             "Open MPI time / Chorus time = Chorus busbw / Open MPI busbw; in brackets the range "
             "of the per-repetition ratios; reps: measurements per library.\n")
    for c in COLLS:
        for n in sorted({k[2] for k in med if k[1] == "ucx"}):
            sizes = sorted({k[4] for k in med if k[1] == "ucx" and k[2] == n and k[3] == c})
            if not sizes:
                continue
            L.append(f"#### {COLL_TITLE[c]}, {n} ranks, {ucx_label(meta)}\n")
            L.append("| Size | Band | Chorus us | Open MPI us | Chorus busbw | Open MPI busbw | "
                     "Chorus/OMPI | reps |")
            L.append("|---|---|---|---|---|---|---|---|")
            for s in sizes:
                ch, om = med.get(("chorus", "ucx", n, c, s)), med.get(("ompi", "ucx", n, c, s))
                pr = paired(ch, om)
                rng = f" [{min(pr):.2f}–{max(pr):.2f}]" if len(pr) > 1 else ""
                L.append(f"| {fmt_size(s)} | {band_of.get(s, '?')} | {fr(ch and ch['time_us'])} | "
                         f"{fr(om and om['time_us'])} | {f3(ch and ch['busbw'])} | "
                         f"{f3(om and om['busbw'])} | "
                         f"{fr(ch and om and om['time_us'] / ch['time_us'])}{rng} | "
                         f"{ch['n'] if ch else 0}/{om['n'] if om else 0} |")
            L.append("")
    return L


def print_ucx_table(state, med):
    rows = ucx_summary(med)
    if rows:
        log(f"\nUCX: Chorus vs Open MPI, {ucx_label(state['meta'])} (not issue 3 targets):")
        for line in ucx_summary_table(rows):
            log("  " + line)


def make_plots(state, med, lim, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"plots skipped: matplotlib not importable ({e}); apt-get install python3-matplotlib")
        state["meta"]["plots_error"] = str(e)
        return []
    files = []
    style = {"chorus": ("tab:blue", "o"), "ompi": ("tab:orange", "s"), "gloo": ("tab:green", "^")}
    ucx_tls = state["meta"].get("ucx_tls", "?")
    for c in COLLS:
        for tr in ALL_TRANSPORTS:
            fig, ax = plt.subplots(figsize=(8, 5))
            anything = False
            for lib in LIBS:
                pts = sorted((k[4], v) for k, v in med.items()
                             if k[0] == lib and k[1] == tr and k[2] == 2 and k[3] == c)
                if not pts:
                    continue
                anything = True
                col, mk = style[lib]
                ax.plot([p[0] for p in pts], [p[1]["busbw"] for p in pts], marker=mk, ms=4,
                        color=col, label=LIB_TITLE[lib] + (" (TCP loopback)" if lib == "gloo" else ""))
                rep = [p for p in pts if p[1]["n"] > 1]
                if rep:
                    ax.vlines([p[0] for p in rep], [p[1]["busbw_min"] for p in rep],
                              [p[1]["busbw_max"] for p in rep], color=col, alpha=0.5)
            if not anything:
                plt.close(fig)
                continue
            mem = tr == "shm" or (tr == "ucx" and ucx_bound_kind(ucx_tls) == "memory")
            bound = mem_bound_busbw(c, lim) if mem else tcp_bound_busbw(c, lim)
            if tr == "ucx" and ucx_bound_kind(ucx_tls) is None:
                bound = None  # tcp and shared memory mixed: no single bound applies
            if bound:
                ax.axhline(bound, color="gray", ls="--",
                           label=("memory-bandwidth bound" if mem else "TCP loopback bound")
                           + f" ({bound:.2f} GB/s)")
            ax.set_xscale("log", base=2)
            ticks = [8 << (4 * i) for i in range(7)]  # 8 B, 128 B, 2 KiB, ... 128 MiB
            ax.set_xticks(ticks)
            ax.set_xticklabels([fmt_size(t).replace(" ", "") for t in ticks])
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel("busbw (GB/s)")
            trt = tr if tr != "ucx" else f"both over UCX (UCX_TLS={ucx_tls})"
            ax.set_title(f"{COLL_TITLE[c]}, {trt}, 2 ranks (median; bars: min–max over repetitions)",
                         **({"fontsize": 10} if tr == "ucx" else {}))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="upper left", fontsize=8)
            p = os.path.join(out_dir, f"{c}_{tr}_2ranks.png")
            fig.tight_layout()
            fig.savefig(p, dpi=100)
            plt.close(fig)
            files.append(p)
    return files


# ------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="reduced sweep: 8 B..4 KiB (x8) and 1..128 MiB with -n 3, one repetition")
    ap.add_argument("--build-dir", default=None,
                    help="CMake build directory with the tools (default: build-cmp, else build)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"), help="output directory")
    ap.add_argument("--reps", type=int, default=None,
                    help="repetitions of the target sizes (default 3, 1 with --quick)")
    ap.add_argument("--ranks", default="2,4", help="comma list of rank counts (2,4)")
    ap.add_argument("--transports", default="shm,tcp",
                    help="comma list of shm, tcp, ucx (default shm,tcp); ucx: Chorus "
                         "CHORUS_TRANSPORT=UCX against Open MPI --mca pml ucx, reported apart")
    ap.add_argument("--peers", default="chorus,ompi,gloo")
    ap.add_argument("--check", choices=["none", "first", "all"], default="first",
                    help="verify results (-c 1): none; first: the first repetition up to 16 MiB; "
                         "all: every job (default first)")
    ap.add_argument("--tcp-if", default="lo", help="interface for Open MPI's tcp btl and Gloo")
    ap.add_argument("--ucx-tls", default="tcp,self",
                    help="UCX_TLS for both libraries over ucx (default tcp,self; e.g. sm,self or "
                         "tcp,sm,self)")
    ap.add_argument("--ucx-net-devices", default="lo",
                    help="UCX_NET_DEVICES for both libraries over ucx (default lo)")
    ap.add_argument("--ompi-bind", default="none",
                    help="mpirun --bind-to (none: like chorus-run, which does not pin)")
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    ap.add_argument("--chorus-env", action="append", default=[], metavar="NAME=VALUE",
                    help="extra environment for Chorus's ranks (chorus-run -x), repeatable; "
                         "e.g. CHORUS_SHM_CMA_BYTES=0")
    ap.add_argument("--chorus-register", action="store_true",
                    help="Chorus's buffers come from ncclMemAlloc and are registered with "
                         "ncclCommRegister (the tools' -R 1): same-host transfers copy once")
    ap.add_argument("--max-size", default=None, metavar="SIZE",
                    help="cap every band at SIZE bytes (K/M suffixes), dropping bands that start "
                         "above it: for quick plumbing checks, e.g. --quick --max-size 64K; the "
                         "targets at larger sizes then read N/A")
    ap.add_argument("--max-job-timeout", type=float, default=900.0)
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="before each job wait up to SECONDS until other processes use < 0.3 "
                         "cores (0: do not wait)")
    ap.add_argument("--estimate", action="store_true", help="print the plan and estimate, then exit")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild ratios.md and the plots from OUT/results.json")
    args = ap.parse_args()
    args.ranks = [int(x) for x in args.ranks.split(",") if x]
    args.transports = [t for t in args.transports.split(",") if t]
    args.peers = [p for p in args.peers.split(",") if p]
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    bad = [t for t in args.transports if t not in ALL_TRANSPORTS] + [p for p in args.peers if p not in LIBS]
    if bad or args.reps < 1 or any(n < 2 for n in args.ranks):
        ap.error(f"bad --transports/--peers/--reps/--ranks ({', '.join(bad)})")
    if any(kv.split("=", 1)[0] in ("UCX_TLS", "UCX_NET_DEVICES") for kv in args.chorus_env):
        ap.error("set UCX_TLS / UCX_NET_DEVICES with --ucx-tls / --ucx-net-devices (for both "
                 "libraries), not --chorus-env")
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.json")

    if args.report_only:
        with open(results_path) as f:
            state = json.load(f)
        med = {k: summarize(v) for k, v in collect(state).items()}
        med = {k: v for k, v in med.items() if v}
        plots = make_plots(state, med, limits_summary(state), args.out)
        write_report(state, args.out, plots)
        log(f"wrote {os.path.join(args.out, 'ratios.md')}")
        print_ucx_table(state, med)
        return 0

    build = args.build_dir or next((os.path.join(REPO, d) for d in ("build-cmp", "build")
                                    if os.path.isdir(os.path.join(REPO, d))), os.path.join(REPO, "build"))
    tools = find_tools(build)
    peers = probe_peers(tools, args.python, args.transports)
    for lib in LIBS:
        log(f"{LIB_TITLE[lib]:>9}: " + (peers[lib].get("version", "ok") if peers[lib]["ok"]
                                         else "MISSING — " + peers[lib]["why"]))
    if "ucx" in args.transports:
        log(f"ucx: both libraries with UCX_TLS={args.ucx_tls} UCX_NET_DEVICES={args.ucx_net_devices}")
        for lib in ("chorus", "ompi"):
            if peers[lib]["ok"] and peers[lib].get("ucx_why"):
                log(f"ucx: {LIB_TITLE[lib]}: " + ("SKIPPED — " if peers[lib].get("ucx") is False
                                                   else "") + peers[lib]["ucx_why"])
    if not peers["chorus"]["ok"]:
        log(f"Chorus's tools are missing in {build}; build them first:\n"
            f"  cmake -S {REPO} -B {build} -DCMAKE_BUILD_TYPE=Release && make -C {build} -j2")
    bands = QUICK_BANDS if args.quick else FULL_BANDS
    if args.max_size:
        cap = parse_size(args.max_size)
        # Each band ends at its largest size <= cap (its buffers then have that size).
        bands = [dict(b, e=[s for s in band_sizes(b) if s <= cap][-1])
                 for b in bands if b["b"] <= cap]
        if not bands:
            ap.error(f"--max-size {args.max_size}: below every band's smallest size")
    jobs = plan_jobs(args, bands, peers)
    est = sum(estimate_job(j, checked(j, args)) for j in jobs) + (25 if args.quick else 60)  # + machine limits
    log(f"plan: {len(jobs)} jobs, ranks {args.ranks}, transports {args.transports}, "
        f"{args.reps} repetition(s); estimated {est / 60:.1f} min (fitted to a quiet 2-core VM; "
        "up to about twice that while other processes load the machine)")
    if args.estimate or not jobs:
        return 0 if jobs else 1

    raw_dir = os.path.join(args.out, "raw")
    if os.path.isdir(raw_dir):
        shutil.rmtree(raw_dir)
    os.makedirs(raw_dir)
    state = {"meta": {"started": datetime.datetime.now().isoformat(timespec="seconds"),
                      "command": " ".join([sys.executable] + sys.argv),
                      "quick": args.quick, "reps": args.reps, "ranks": args.ranks,
                      "transports": args.transports, "bands": bands, "build_dir": build,
                      "tcp_if": args.tcp_if, "ompi_bind": args.ompi_bind, "check": args.check,
                      "chorus_env": args.chorus_env,
                      "chorus_register": args.chorus_register,
                      "machine": machine_info(), "peers": peers, "estimate_s": round(est)},
             "limits": {}, "runs": []}
    if "ucx" in args.transports:
        state["meta"]["ucx_tls"] = args.ucx_tls
        state["meta"]["ucx_net_devices"] = args.ucx_net_devices
    t0 = time.monotonic()

    def save():
        state["meta"]["runtime_s"] = round(time.monotonic() - t0, 1)
        tmp = results_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, results_path)

    if peers["chorus"]["ok"]:
        state["meta"]["chorus_transports"] = verify_transports(
            tools, args, raw_dir, [t for t in args.transports
                                   if t != "ucx" or peers["chorus"].get("ucx") is not False])
        for k, v in state["meta"]["chorus_transports"].items():
            log(f"Chorus transport check {k}: {'ok' if v['ok'] else 'UNEXPECTED'} "
                f"(peers over {v['peers_over']})" +
                (f"; {v['ucx_context']}; lanes {v['ucx_lanes']}" if k.startswith("ucx") else ""))
    if "ucx" in args.transports and "ompi" in args.peers and peers["ompi"]["ok"] and \
            peers["ompi"].get("ucx") is not False:
        state["meta"]["ompi_transports"] = verify_ompi_ucx(tools, args, raw_dir)
        for k, v in state["meta"]["ompi_transports"].items():
            log(f"Open MPI transport check {k}: {'ok' if v['ok'] else 'UNEXPECTED'} (pml "
                f"{', '.join(v['pml_selected']) or 'none'} selected on {v['ranks_selected']} "
                f"rank(s); UCX endpoints {'; '.join(v['ucx_ep_configs']) or 'none logged'})")
    log("machine limits (start) ...")
    state["limits"]["start"] = run_limits(tools, args, raw_dir, "start")
    save()
    run_jobs(jobs, tools, args, raw_dir, state, save)
    log("machine limits (end) ...")
    state["limits"]["end"] = run_limits(tools, args, raw_dir, "end")
    save()
    med = {k: summarize(v) for k, v in collect(state).items()}
    med = {k: v for k, v in med.items() if v}
    plots = make_plots(state, med, limits_summary(state), args.out)
    state["meta"]["plots"] = [os.path.basename(p) for p in plots]
    save()
    write_report(state, args.out, plots)
    save()
    nbad = sum(r["status"] != "ok" for r in state["runs"])
    log(f"done in {(time.monotonic() - t0) / 60:.1f} min (estimated {est / 60:.1f}); "
        f"{nbad} failed job(s); wrote {results_path}, {os.path.join(args.out, 'ratios.md')} "
        f"and {len(plots)} plot(s)")
    for t in state["targets"]:
        log(f"  {t['verdict']:>4}  {t['target']}")
    print_ucx_table(state, med)
    return 0 if nbad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
