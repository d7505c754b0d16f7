#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# File: tests/accuracy/run_accuracy.py
# The FP8 accuracy test (ctest label `accuracy`): trains the digits MLP of train_digits.py with
# 4 data-parallel ranks under chorus-run, in three configurations and 3 seeds each, then
#   - checks that every rank of every training ends with bitwise identical weights,
#   - prints the final test accuracies (per seed, mean per config) and the FP8 - FP32 deltas,
#   - fails (exit 1) when an FP8 configuration's mean is more than --max-delta-pp percentage
#     points from the FP32 mean,
#   - writes OUT/accuracy_curves.csv, OUT/accuracy_summary.csv and OUT/accuracy_loss.png.
# Exit 77 (skipped) when numpy, matplotlib or the digits file (python3-sklearn) is missing.
#
#   run_accuracy.py --lib build/src/libchorus.so --chorus-run build/tools/chorus-run \
#       --out build/tests/accuracy
import argparse
import csv
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
CONFIGS = ("fp32", "fp8", "fp8ef")
LABELS = {"fp32": "FP32 (ncclAllReduce)",
          "fp8": "FP8 E4M3 (chorusAllReduceCompressed)",
          "fp8ef": "FP8 E4M3 + error feedback",
          "env": "FP8 E4M3 via CHORUS_COMPRESS (ncclAllReduce)"}


def skip(why):
    print(f"run_accuracy: SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True, help="libchorus.so")
    p.add_argument("--chorus-run", required=True, help="the chorus-run launcher")
    p.add_argument("--out", required=True, help="output directory (its runs/ emptied first)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated; the first is the reference (fp32)")
    p.add_argument("--max-delta-pp", type=float, default=0.5)
    p.add_argument("--timeout", type=int, default=150, help="per chorus-run launch, seconds")
    p.add_argument("--transparent", action="store_true",
                   help="also run config 'env': plain ncclAllReduce under CHORUS_COMPRESS="
                        "FP8_E4M3, CHORUS_COMPRESS_POLICY=always (must match fp8 bitwise)")
    p.add_argument("--fp32-algo", default="ring",
                   help="CHORUS_ALGO for the fp32 runs' AllReduce (auto: the tuner's choice). "
                        "ring: the reference is bitwise reproducible; the tuner picked twoshot "
                        "for these 38 KB on 4 ranks, whose sums vary from run to run")
    p.add_argument("--no-train", action="store_true",
                   help="only aggregate (table, checks, CSV, plot) the runs already in OUT/runs")
    p.add_argument("train_args", nargs="*", help="passed to train_digits.py (after --)")
    a = p.parse_args()

    try:
        import numpy as np
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        skip(f"{e} (install python3-numpy python3-matplotlib; run with /usr/bin/python3)")
    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    import train_digits
    if not os.path.exists(train_digits.DIGITS):
        skip(f"{train_digits.DIGITS} missing (install python3-sklearn)")

    seeds = [int(s) for s in a.seeds.split(",")]
    configs = a.configs.split(",")
    if a.transparent:
        configs.append("env")
    ref = configs[0]
    runs_dir = os.path.join(a.out, "runs")  # only this is emptied: --out may hold more
    if not a.no_train:
        if os.path.isdir(runs_dir):
            shutil.rmtree(runs_dir)
        os.makedirs(runs_dir)

    # One launch of 4 ranks per configuration, its ranks training one seed after another (one
    # communicator, a new compressor per training), the configurations one after another.
    t_all = time.monotonic()
    for config in configs if not a.no_train else []:
        cmd = [a.chorus_run, "-n", str(a.ranks), "--timeout", str(a.timeout)]
        if config == "env":
            cmd += ["-x", "CHORUS_COMPRESS=FP8_E4M3", "-x", "CHORUS_COMPRESS_POLICY=always",
                    "-x", "CHORUS_COMPRESS_MIN_BYTES=0"]  # 9610 floats < 256 KiB
        if config == "fp32" and a.fp32_algo != "auto":
            cmd += ["-x", f"CHORUS_ALGO=allreduce:{a.fp32_algo}"]
        cmd += [sys.executable, os.path.join(HERE, "train_digits.py"), "--lib", a.lib,
                "--out", runs_dir]
        for seed in seeds:
            cmd += ["--run", f"{config}:{seed}"]
        cmd += a.train_args
        t0 = time.monotonic()
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print(f"run_accuracy: FAILED: {' '.join(cmd)} exited {rc}", flush=True)
            return 1
        print(f"run_accuracy: {config}: {len(seeds)} trainings of {a.ranks} ranks in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
    wall = time.monotonic() - t_all

    import json
    results, failures = {}, []
    for config in configs:
        for seed in seeds:
            per_rank = []
            for r in range(a.ranks):
                with open(os.path.join(runs_dir, f"{config}-s{seed}-r{r}.json")) as f:
                    per_rank.append(json.load(f))
            shas = {x["weights_sha256"] for x in per_rank}
            accs = {x["final_test_acc"] for x in per_rank}
            if len(shas) != 1 or len(accs) != 1:
                failures.append(f"{config} seed {seed}: the ranks' final weights differ "
                                f"({len(shas)} distinct SHA-256)")
            results[config, seed] = per_rank[0]

    # Table
    mean = {c: 100 * float(np.mean([results[c, s]["final_test_acc"] for s in seeds]))
            for c in configs}
    r0 = results[ref, seeds[0]]
    print()
    print(f"Digits MLP 64-{r0['hyper']['hidden']}-10, {a.ranks} ranks, {r0['epochs']} epochs x "
          f"{r0['steps_per_epoch']} steps, global batch {r0['global_batch']}, "
          f"{r0['params']} parameters; train {r0['train_size']}, test {r0['test_size']} images")
    head = f"{'config':<8}" + "".join(f"{'seed ' + str(s):>10}" for s in seeds) + \
        f"{'mean':>10}{'delta pp':>10}{'wire/data':>11}"
    print(head)
    print("-" * len(head))
    for c in configs:
        row = f"{c:<8}" + "".join(f"{100 * results[c, s]['final_test_acc']:>10.2f}"
                                  for s in seeds)
        delta = mean[c] - mean[ref]
        bc = results[c, seeds[0]].get("byte_counters")
        ratio = f"{bc['wireBytesSent'] / bc['dataBytesSent']:.3f}" \
            if bc and bc["dataBytesSent"] else "n/a"
        row += f"{mean[c]:>10.2f}{'' if c == ref else f'{delta:+.2f}':>10}{ratio:>11}"
        print(row)
        if c != ref and abs(delta) > a.max_delta_pp:
            failures.append(f"{c}: mean test accuracy {mean[c]:.2f} % is {delta:+.2f} pp from "
                            f"{ref}'s {mean[ref]:.2f} % (allowed +-{a.max_delta_pp} pp)")
    print("(test accuracy in %; delta: mean - the fp32 mean; wire/data: bytes sent over "
          "bytes they stand for, rank 0, seed " + str(seeds[0]) + ")")
    # The FP8 configurations must really have moved FP8: their bytes on the wire about 26 % of
    # the fp32 bytes they stand for (1 byte per value + a 4-byte scale per 128), fp32's all.
    for c in configs:
        for s in seeds:
            bc = results[c, s].get("byte_counters")
            if not bc:
                continue
            ratio = bc["wireBytesSent"] / bc["dataBytesSent"] if bc["dataBytesSent"] else None
            if c == "fp32" and ratio != 1.0:
                failures.append(f"fp32 seed {s}: wire/data bytes {ratio}, not 1")
            if c != "fp32" and (ratio is None or ratio > 0.5):
                failures.append(f"{c} seed {s}: wire/data bytes {ratio}: not compressed")
    if "env" in configs and "fp8" in configs:
        for s in seeds:
            if results["env", s]["weights_sha256"] != results["fp8", s]["weights_sha256"]:
                failures.append(f"env seed {s}: CHORUS_COMPRESS's weights differ from fp8's")

    # CSV of the curves, a summary CSV, the plot
    curves_csv = os.path.join(a.out, "accuracy_curves.csv")
    with open(curves_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "seed", "epoch", "step", "train_loss", "train_acc", "test_loss",
                    "test_acc", "rank0_batch_loss"])
        for c in configs:
            for s in seeds:
                for e in results[c, s]["curves"]:
                    w.writerow([c, s, e["epoch"], e["step"], f"{e['train_loss']:.6g}",
                                f"{e['train_acc']:.6g}", f"{e['test_loss']:.6g}",
                                f"{e['test_acc']:.6g}",
                                "" if e["batch_loss"] is None else f"{e['batch_loss']:.6g}"])
    summary_csv = os.path.join(a.out, "accuracy_summary.csv")
    with open(summary_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "seed", "final_test_acc_pct", "final_test_loss", "weights_sha256",
                    "train_wall_s"])
        for c in configs:
            for s in seeds:
                x = results[c, s]
                w.writerow([c, s, f"{100 * x['final_test_acc']:.2f}",
                            f"{x['final_test_loss']:.6g}", x["weights_sha256"],
                            f"{x['wall_s']:.2f}"])
            w.writerow([c, "mean", f"{mean[c]:.2f}", "", "", ""])

    png = os.path.join(a.out, "accuracy_loss.png")
    fig, ((ax1, ax2), (ax4, ax3)) = plt.subplots(2, 2, figsize=(14, 9))
    colors = {"fp32": "tab:blue", "fp8": "tab:orange", "fp8ef": "tab:green", "env": "tab:red"}
    styles = ["-", "--", ":", "-."]
    for c in configs:
        for i, s in enumerate(seeds):
            ep = [e["epoch"] for e in results[c, s]["curves"]]
            lab = f"{LABELS.get(c, c)}, seed {s}"
            ax1.plot(ep, [e["train_loss"] for e in results[c, s]["curves"]],
                     color=colors.get(c), ls=styles[i % 4], lw=1.2, label=lab)
            ax2.plot(ep, [e["test_loss"] for e in results[c, s]["curves"]],
                     color=colors.get(c), ls=styles[i % 4], lw=1.2, label=lab)
            if c != ref:  # the FP8 curves lie on FP32's at this scale: their differences
                base = [e["train_loss"] for e in results[ref, s]["curves"]]
                ax4.plot(ep, [e["train_loss"] - b for e, b in zip(results[c, s]["curves"], base)],
                         color=colors.get(c), ls=styles[i % 4], lw=1.2, label=lab)
            ax3.plot(ep[1:], [100 * e["test_acc"] for e in results[c, s]["curves"][1:]],
                     color=colors.get(c), ls=styles[i % 4], lw=1.2, label=lab)
    for ax, t in ((ax1, "training loss (whole training set)"), (ax2, "test loss")):
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("softmax cross-entropy")
        ax.set_title(t)
        ax.grid(True, which="both", alpha=0.3)
    ax4.axhline(0, color=colors.get(ref), lw=1)
    ax4.set_yscale("symlog", linthresh=1e-4)
    ax4.set_xlabel("epoch")
    ax4.set_ylabel("difference of cross-entropy")
    ax4.set_title(f"training loss minus {ref}'s (same seed)")
    ax4.grid(True, which="both", alpha=0.3)
    ax3.set_xlabel("epoch")
    ax3.set_ylabel("%")
    ax3.set_title("test accuracy")
    ax3.set_ylim(90, 100)
    ax3.grid(True, alpha=0.3)
    ax3.legend(fontsize=7, loc="lower right")
    fig.suptitle("Chorus: digits MLP, 4 data-parallel ranks; test accuracy (mean of "
                 f"{len(seeds)} seeds): " +
                 ", ".join(f"{c} {mean[c]:.2f} %" for c in configs), fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)

    print()
    print(f"run_accuracy: curves  {curves_csv}")
    print(f"run_accuracy: summary {summary_csv}")
    print(f"run_accuracy: plot    {png}")
    print(f"run_accuracy: {len(configs) * len(seeds)} trainings of {a.ranks} ranks in "
          f"{wall:.1f} s")
    if failures:
        for m in failures:
            print(f"run_accuracy: FAILED: {m}")
        return 1
    print(f"run_accuracy: PASSED: identical weights on every rank; every FP8 mean within "
          f"{a.max_delta_pp} pp of {ref}'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
