#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# File: bench/route/plot_timeline.py
# Reads path_timeline's CSV and the events of path_timeline.sh, prints each phase's throughput
# against the capacity of the links in it, the reaction time after each change and the longest
# pause (nothing received by rank 0 between two samples, or longer) in each phase, and plots
# each path's throughput over time (PNG) with the events marked.
#
#   plot_timeline.py SAMPLES.csv EVENTS.txt OUT.png [--bin-ms 50]
#
# EVENTS.txt: one line per event, "wall_ns capacity_Bps label" (capacity: what the links give in
# the direction measured from then on; 0 = not known, e.g. shared with iperf3). The first event
# is the start of the measurement.
import csv
import sys
from collections import defaultdict


def main():
    args = sys.argv[1:]
    bin_ms = 50.0
    if "--bin-ms" in args:
        i = args.index("--bin-ms")
        bin_ms = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 3:
        sys.exit("usage: plot_timeline.py SAMPLES.csv EVENTS.txt OUT.png [--bin-ms 50]")
    samples_path, events_path, png_path = args

    series = defaultdict(list)  # path -> [(t_s, recv_bytes, sent_bytes)]
    with open(samples_path) as f:
        for row in csv.DictReader(f):
            series[int(row["path"])].append(
                (int(row["t_ns"]) / 1e9, int(row["recv_bytes"]), int(row["sent_bytes"])))
    events = []
    with open(events_path) as f:
        for line in f:
            parts = line.split(maxsplit=2)
            if len(parts) == 3:
                events.append((int(parts[0]) / 1e9, float(parts[1]), parts[2].strip()))
    if not series or not events:
        sys.exit("plot_timeline.py: no samples or no events")
    t0 = events[0][0]

    # Per path: received throughput in bins (bytes completed in the bin / bin length).
    bin_s = bin_ms / 1e3
    paths = sorted(series)
    t_end = max(s[-1][0] for s in series.values())
    nbins = int((t_end - t0) / bin_s)
    def binned(points):
        out = [0.0] * nbins
        for (ta, ba, _), (tb, bb, _) in zip(points, points[1:]):
            # Spread the bytes of each sampling interval evenly over it.
            if tb <= ta or bb == ba:
                continue
            rate = (bb - ba) / (tb - ta)
            a, b = ta - t0, tb - t0
            k = max(int(a / bin_s), 0)
            while k < nbins and k * bin_s < b:
                lo, hi = max(a, k * bin_s), min(b, (k + 1) * bin_s)
                if hi > lo:
                    out[k] += rate * (hi - lo) / bin_s
                k += 1
        return out
    per_path = {p: binned(series[p]) for p in paths}
    total = [sum(per_path[p][k] for p in paths) for k in range(nbins)]
    times = [(k + 0.5) * bin_s for k in range(nbins)]

    # Rank 0's total received bytes at each sampling round (every path sampled at once).
    rounds = defaultdict(int)
    for p in paths:
        for t, recv, _ in series[p]:
            rounds[t - t0] += recv
    round_times = sorted(rounds)

    def longest_pause(a, b):
        """The longest stretch within [a, b) in which nothing arrived (sampling resolution)."""
        longest, since, last = 0.0, None, None
        for t in round_times:
            if t < a or t >= b:
                continue
            if last is not None and rounds[t] == last:
                since = t_prev if since is None else since
                longest = max(longest, t - since)
            else:
                since = None
            last, t_prev = rounds[t], t
        return longest

    def mean_between(values, a, b):
        sel = [v for t, v in zip(times, values) if a <= t < b]
        return sum(sel) / len(sel) if sel else 0.0

    print(f"# {len(paths)} paths, {nbins} bins of {bin_ms:.0f} ms, received by rank 0 (MB/s = 1e6 B/s)")
    rel = [(t - t0, cap, label) for t, cap, label in events]
    for i, (start, cap, label) in enumerate(rel):
        end = rel[i + 1][0] if i + 1 < len(rel) else times[-1]
        settled = mean_between(total, start + 0.5, end)
        shares = "  ".join(f"path{p} {mean_between(per_path[p], start + 0.5, end) / 1e6:7.1f}"
                           for p in paths)
        line = f"{label:<34} t={start:5.2f}s  settled total {settled / 1e6:7.1f} MB/s"
        if cap > 0:
            line += f" = {100 * settled / cap:5.1f}% of {cap / 1e6:.1f}"
            # Reaction: from the event to the end of the first 100 ms window at >= 90 %.
            win = max(1, int(round(0.1 / bin_s)))
            k0 = next((k for k, t in enumerate(times) if t >= start), nbins)
            react = None
            for k in range(k0, nbins - win + 1):
                if times[k] >= end:
                    break
                if sum(total[k:k + win]) / win >= 0.9 * cap:
                    react = times[k + win - 1] + bin_s / 2 - start
                    break
            if i > 0:
                line += (f"; >= 90% over 100 ms reached {react * 1e3:.0f} ms after the change"
                         if react is not None else "; never >= 90% over 100 ms")
        if i > 0:
            line += f"; longest pause {longest_pause(start, end) * 1e3:.0f} ms"
        print(line + f"   [{shares}]")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_timeline.py: matplotlib missing (python3-matplotlib): no plot")
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for p in paths:
        ax.plot(times, [v * 8 / 1e9 for v in per_path[p]], label=f"path {p} (rail {p})", lw=1)
    ax.plot(times, [v * 8 / 1e9 for v in total], label="total", lw=1.5, color="black")
    for start, cap, label in rel:
        ax.axvline(start, color="grey", ls="--", lw=0.8)
        ax.text(start + 0.03, 0.05, label, rotation=90,
                va="bottom", fontsize=7, color="grey")
        if cap > 0:
            nxt = next((s for s, _, _ in rel if s > start), times[-1])
            ax.hlines(cap * 8 / 1e9, start, nxt, colors="red", linestyles=":", lw=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"received, Gbit/s ({bin_ms:.0f} ms bins)")
    ax.set_title("Chorus: throughput per path as the links change (red: capacity)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print(f"# plot: {png_path}")


if __name__ == "__main__":
    main()
