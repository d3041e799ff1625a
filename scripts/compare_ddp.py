#!/usr/bin/python3
"""The table and plot of scripts/compare-ddp from its run folder: the
trainers' lines "round R  loss L  test acc A  T s" of consensusd's nodes
(RUN/consensusd/nI.trainer.log) and of DDP's rank 0 (RUN/ddp-rank0.log),
and the CPU seconds each side took (RUN/consensusd/cpu: the trainers' and
the daemons'; RUN/ddp-cpu: the ranks').

    scripts/compare_ddp.py RUN STEPS      (writes RUN/accuracy.png)
"""
import glob
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LINE = re.compile(r"round (\d+)\s+loss \S+\s+test acc ([0-9.]+)\s+([0-9.]+) s")
TARGETS = (0.85, 0.89)
SMOOTHED = 3  # points averaged for the smoothed crossing


FIRST = re.compile(r"first step at ([0-9.]+) \(unix time\)")


def curve(path, shift=0.0):
    """[(round, accuracy, seconds - shift)] of one trainer's log."""
    with open(path) as lines:
        return [(int(m[1]), float(m[2]), float(m[3]) - shift) for m in map(LINE.search, lines) if m]


def first_step(path):
    """When the trainer took its first step (unix time), or None."""
    with open(path) as lines:
        return next((float(m[1]) for m in map(FIRST.search, lines) if m), None)


def cpu_seconds(path):
    """The CPU seconds recorded in `path` (one or more numbers), or None."""
    if not os.path.exists(path):
        return None
    with open(path) as numbers:
        return [float(x) for x in numbers.read().split()]


def cpu_per_step(seconds, steps, part=None):
    """CPU ms per step, and a part of it (the daemons') in parentheses."""
    if seconds is None:
        return "-"
    total = f"{1000 * sum(seconds) / steps:.0f}"
    if part is None or part >= len(seconds):
        return total
    return f"{total} (daemons {1000 * seconds[part] / steps:.0f})"


def first_time(points, target, window=1):
    """When the mean of the last `window` points first reached `target`: 1 is the
    first crossing; 3 smooths out the test set's noise (2,000 images: about
    0.7 points either way) at the price of a later time."""
    for k in range(window - 1, len(points)):
        if sum(p[1] for p in points[k - window + 1:k + 1]) / window >= target:
            return points[k][2]
    return None


def seconds(value):
    return "-" if value is None else f"{value:.0f} s"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    run, steps = sys.argv[1], int(sys.argv[2])
    rows = []
    fig, ax = plt.subplots(figsize=(8, 5))
    # Time from when the last trainer started, as DDP's clock starts once
    # every rank has joined: the trainers' start-up (torch's import, eight at
    # once on two cores) is in neither.
    logs = sorted(glob.glob(os.path.join(run, "consensusd", "n*.trainer.log")))
    starts = [first_step(p) for p in logs]
    last = max((s for s in starts if s is not None), default=None)
    nodes = [curve(p, last - s if last is not None and s is not None else 0.0)
             for p, s in zip(logs, starts)]
    nodes = [points for points in nodes if points]
    if nodes:
        # n0 measures on the way, as DDP's rank 0; every node at the end.
        n0 = nodes[0]
        finals = [points[-1][1] for points in nodes if points[-1][0] == steps]
        rows.append(("consensusd (n0)", *(seconds(first_time(n0, t)) for t in TARGETS),
                     seconds(first_time(n0, TARGETS[-1], SMOOTHED)),
                     f"{steps / n0[-1][2]:.1f}",
                     cpu_per_step(cpu_seconds(os.path.join(run, "consensusd", "cpu")), steps, 1),
                     f"{statistics.mean(finals):.4f} (mean), {min(finals):.4f} (lowest)"
                     if finals else "-"))
        ax.plot([p[2] for p in n0], [p[1] for p in n0], color="tab:blue", linewidth=2,
                label="consensusd (n0)")
        ax.scatter([p[-1][2] for p in nodes[1:]], [p[-1][1] for p in nodes[1:]],
                   color="tab:blue", s=14, label="consensusd, the other nodes at the end")
    ddp = curve(os.path.join(run, "ddp-rank0.log")) if os.path.exists(
        os.path.join(run, "ddp-rank0.log")) else []
    if ddp:
        rows.append(("DDP (gloo)", *(seconds(first_time(ddp, t)) for t in TARGETS),
                     seconds(first_time(ddp, TARGETS[-1], SMOOTHED)),
                     f"{steps / ddp[-1][2]:.1f}",
                     cpu_per_step(cpu_seconds(os.path.join(run, "ddp-cpu")), steps),
                     f"{ddp[-1][1]:.4f}" if ddp[-1][0] == steps else "-"))
        ax.plot([p[2] for p in ddp], [p[1] for p in ddp], color="tab:red", linewidth=2,
                label="DDP (gloo)")
    header = ("run", *(f"to {t}" for t in TARGETS), f"to {TARGETS[-1]}, mean of {SMOOTHED}",
              "steps/s", "CPU ms/step", "final accuracy")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    ax.set_xlabel("seconds from the first step")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.6, 0.93)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.savefig(os.path.join(run, "accuracy.png"), dpi=100, bbox_inches="tight")
    print(f"plot: {os.path.join(run, 'accuracy.png')}")


if __name__ == "__main__":
    main()
