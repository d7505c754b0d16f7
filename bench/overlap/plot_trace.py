#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# File: bench/overlap/plot_trace.py
# One step of the overlap scheduler per policy, as a timeline (PNG): each bucket of rank 0's
# last step (chorusOverlapDumpTrace's Chrome trace, as bench/overlap/overlap_speed.sh writes
# them) is a bar from its launch to its end, on the row of the layers it carries (layer 0, the
# forward pass's first, at the top), one panel per policy on a shared time axis.
#
#   plot_trace.py DIR [OUT.png]      DIR: one shape's directory (overlap_<policy>_rank0.json)
# Needs Debian's python3-matplotlib (/usr/bin/python3).
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    bars = []
    for e in events:
        layers = e["name"].split("(layers ")[1].rstrip(")").split("-")
        bars.append((int(layers[0]), int(layers[1]), e["ts"] / 1e3, e["dur"] / 1e3,
                     e["args"]["bytes"], e["args"]["staged"]))
    return bars


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: plot_trace.py DIR [OUT.png]")
    folder = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(folder, "timeline.png")
    files = sorted(glob.glob(os.path.join(folder, "overlap_*_rank0.json")))
    if not files:
        sys.exit(f"plot_trace.py: no overlap_*_rank0.json in {folder}")
    fig, axes = plt.subplots(len(files), 1, sharex=True, figsize=(10, 1.8 * len(files) + 0.6))
    if len(files) == 1:
        axes = [axes]
    for ax, path in zip(axes, files):
        policy = os.path.basename(path)[len("overlap_"):-len("_rank0.json")]
        bars = load(path)
        top = max(b[1] for b in bars)
        for lo, hi, start, dur, size, staged in bars:
            ax.barh((lo + hi) / 2, dur, left=start, height=max(hi - lo, 0) + 0.8,
                    color="tab:orange" if staged else "tab:blue", edgecolor="black", linewidth=0.5)
            ax.text(start + dur / 2, (lo + hi) / 2, f"{size / 2**20:.1f}M", ha="center",
                    va="center", fontsize=6)
        end = max(b[2] + b[3] for b in bars)
        ax.set_ylim(top + 0.8, -0.8)
        ax.set_ylabel("layer")
        ax.set_title(f"{policy}: {len(bars)} buckets, last ends at {end:.0f} ms", fontsize=9,
                     loc="left")
    axes[-1].set_xlabel("ms since the step's first bucket (blue: reduced in place, orange: staged)")
    fig.suptitle(f"overlap scheduler, rank 0, last step: {os.path.basename(os.path.normpath(folder))}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
