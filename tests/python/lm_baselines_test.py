#!/usr/bin/python3
"""examples/lm/baselines.py, DDP and DiLoCo, on two ranks over loopback
(gloo): each trains the tiny transformer for 24 steps, rank 0's validation
loss falls well below x_0's (ln 256), and it all-reduced as often as its algorithm says (every step;
every 4th with --local-steps 4). Run by ctest (python.lm-baselines)."""

import math
import os
import re
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "lm", "baselines.py")
VALIDATION = re.compile(r"^step (\d+)\s+loss \S+\s+val loss ([0-9.]+)", re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(algorithm, folder):
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    logs = [os.path.join(folder, f"{algorithm}{rank}.log") for rank in range(2)]
    ranks = [subprocess.Popen(["/usr/bin/python3", SCRIPT, algorithm, "--rank", str(rank),
                               "--world", "2", "--port", port, "--size", "tiny", "--steps", "24",
                               "--local-steps", "4", "--eval-every", "8", "--eval-windows", "64",
                               "--warmup", "4"],
                              stdout=open(logs[rank], "w"), stderr=subprocess.STDOUT, env=env)
             for rank in range(2)]
    try:
        codes = [r.wait(timeout=180) for r in ranks]
    finally:
        for r in ranks:
            r.kill()
    text = open(logs[0]).read()
    assert codes == [0, 0], f"{algorithm}: exit codes {codes}\n{text}\n{open(logs[1]).read()}"
    points = [(int(s), float(v)) for s, v in VALIDATION.findall(text)]
    assert [s for s, _ in points] == [8, 16, 24], f"{algorithm}: {text}"
    # At x_0 every byte is about equally likely: ln 256 = 5.55 nats.
    assert points[-1][1] < 0.8 * math.log(256), f"{algorithm}: the loss did not fall\n{text}"
    reductions = int(re.search(r"all-reduces (\d+) of", text).group(1))
    assert reductions == (24 if algorithm == "ddp" else 6), f"{algorithm}: {reductions}"
    print(f"{algorithm}: validation loss {points[0][1]:.3f} -> {points[-1][1]:.3f}, "
          f"{reductions} all-reduces")


def main():
    with tempfile.TemporaryDirectory() as folder:
        for algorithm in ("ddp", "diloco"):
            run(algorithm, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
