#!/usr/bin/python3
"""The language model's trainer logs, read: the lines train.py and
baselines.py print ("step S  loss L  val loss V  bpb B  T s"), and the
summary `scripts/demo --lm` ends with.

    /usr/bin/python3 examples/lm/report.py RUN   (a run folder of scripts/testbed
                                                  with examples/lm trainers)

prints every node's final validation loss (all the held-out text), rounds,
time and bytes sent per token, writes RUN/val-loss.png (node 0's validation
loss against time) and prints the text node 0's final model wrote.
"""

import glob
import json
import math
import os
import re
import sys

LINE = re.compile(r"step (\d+)\s+loss \S+\s+val loss ([0-9.]+)\s+bpb \S+\s+([0-9.]+) s")
FIRST = re.compile(r"first step at ([0-9.]+) \(unix time\)")


def parse(path):
    """([(step, validation loss, seconds)], unix time of the first step or None)."""
    with open(path) as f:
        text = f.read()
    first = FIRST.search(text)
    return ([(int(m[1]), float(m[2]), float(m[3])) for m in LINE.finditer(text)],
            float(first[1]) if first else None)


def sample(path):
    """The text after the "sample:" line, or None."""
    with open(path) as f:
        text = f.read()
    at = text.find("sample:\n")
    return None if at < 0 else text[at + len("sample:\n"):].strip()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    print(f"\nSummary of {run}")
    print(f"{'node':<6} {'rounds':>7} {'time s':>7} {'val loss':>9} {'bits/byte':>10} "
          f"{'sent MB':>8} {'bytes/token':>12}")
    finals = []
    for path in sorted(glob.glob(os.path.join(run, "n*.jsonl"))):
        node = os.path.basename(path)[:-6]
        with open(path) as lines:
            final = [json.loads(line) for line in lines if '"final"' in line][-1]
        points, _ = parse(os.path.join(run, f"{node}.trainer.log"))
        loss = points[-1][1] if points else math.nan
        finals.append(loss)
        tokens = final["samples"]  # the trainers count tokens as their samples
        per_token = f"{final['sent_bytes'] / tokens:,.0f}" if tokens else "-"
        print(f"{node:<6} {final['round']:>7} {final['t']:>7.1f} {loss:>9.4f} "
              f"{loss / math.log(2):>10.3f} {final['sent_bytes'] / 1e6:>8.1f} {per_token:>12}")
    print(f"highest validation loss over the nodes: {max(finals):.4f} nats per byte")
    points, _ = parse(os.path.join(run, "n0.trainer.log"))
    if points:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        figure, axes = plt.subplots(figsize=(7, 4))
        axes.plot([t for _, _, t in points], [v for _, v, _ in points], marker=".")
        axes.set_xlabel("wall-clock time (s)")
        axes.set_ylabel("validation loss, node 0 (nats per byte)")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(os.path.join(run, "val-loss.png"), dpi=110)
        print(f"plot: {os.path.join(run, 'val-loss.png')}")
    text = sample(os.path.join(run, "n0.trainer.log"))
    if text:
        print("\nWhat node 0's model writes, from \"And\":\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
