"""Launches consensusd clusters with zero compute and prints round efficiency
against the ZeroMQ and mixing rates measured in the same run, or beside MPI
and gloo running the same exchange (--peers), or with trainers attached
(--attach). Called by scripts/bench-rounds."""
import argparse
import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

WARMUP = 3
SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(SOURCE, "python")
ZERO_TRAINER = os.path.join(SOURCE, "tests", "bench", "zero_trainer.py")
GLOO_EXCHANGE = os.path.join(SOURCE, "tests", "bench", "peers", "gloo_exchange.py")
# (nodes P, degree d, generator arguments)
SHAPES = [(4, 2, ["ring"]), (8, 2, ["ring"]), (8, 4, ["random-regular", "--degree", "4"])]


def measured_rounds(size):
    """Rounds timed after the warm-up: rounds of 16 MiB swing by 2x one to the
    next on this 2-core machine, so ten are too few; 64 MiB rounds are long."""
    return 30 if size <= (16 << 20) else 10


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


@functools.lru_cache(maxsize=None)  # read once per run, not once per row
def baseline(path):
    zmq, mix = {}, {}
    for b in json.load(open(path))["benchmarks"]:
        parts = b["run_name"].split("/")
        if parts[0] == "zmqLoopback":
            zmq[int(parts[1])] = b["bytes_per_second"]
        elif parts[0] == "fusedAverage":
            mix[(int(parts[1]), int(parts[2]))] = b["bytes_per_second"]
    return zmq, mix


def launch(args, shape, size, attempt, attach=False, ipc=False, binary=None):
    """The slowest node's mean round time (s). attach: model.kind external, each
    daemon with a zero-update trainer (tests/bench/zero_trainer.py). ipc: the
    nodes talk over ipc:// sockets instead of TCP loopback. binary: the
    folder of another consensusd build (default args.bin)."""
    nodes, degree, gen = shape
    binary = binary or args.bin
    tag = ("-attach" if attach else "") + ("-ipc" if ipc else "") + ("-against" if binary != args.bin else "")
    run = os.path.join(args.work, f"p{nodes}-d{degree}-{size}-{attempt}{tag}")
    os.makedirs(run)
    ctl, daemon = os.path.join(args.bin, "consensusctl"), os.path.join(binary, "consensusd")
    topology = os.path.join(run, "topology.yaml")
    subprocess.run([ctl, "topology", "gen", *gen, "--nodes", str(nodes), "--base-port", "7400",
                    "-o", topology], check=True)
    if ipc:  # same graph, endpoints n<i>.ipc in the run folder
        text = re.sub(r'tcp://127\.0\.0\.1:(\d+)',
                      lambda m: f"ipc://{run}/n{int(m.group(1)) - 7400}.ipc", open(topology).read())
        open(topology, "w").write(text)
    measured = measured_rounds(size)
    settings = [f"model.kind={'external' if attach else 'none'}", f"model.dimension={size // 4}", "data.dataset=synthetic-logistic",
                "consensus.policy=all", "consensus.mailbox_depth=1", "train.eval_every_rounds=0",
                f"train.rounds={WARMUP + measured + 1}", "checkpoint.every_rounds=0",
                "consensus.hard_deadline_ms=60000", "consensus.peer_timeout_ms=60000"]
    children = []
    try:
        for i in range(nodes):
            node = f"n{i}"
            with open(os.path.join(run, node + ".yaml"), "w") as f:
                f.write(f"node: {{id: {node}}}\ntopology: {{file: topology.yaml}}\n"
                        f"status: {{socket: {node}.sock}}\ncheckpoint: {{dir: ckpt-{node}}}\n"
                        f"log: {{metrics_file: {node}.jsonl, level: warn}}\n")
            argv = [daemon, "--config", os.path.join(run, node + ".yaml")]
            for s in settings:
                argv += ["--set", s]
            log = open(os.path.join(run, node + ".log"), "w")
            children.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            if attach:
                trainer = ["/usr/bin/python3", ZERO_TRAINER, os.path.join(run, node + ".trainer.sock"),
                           str(size // 4)]
                children.append(subprocess.Popen(trainer, env=dict(os.environ, PYTHONPATH=PYTHON),
                                                 stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 300
        for child in children:
            child.wait(timeout=max(1, deadline - time.time()))
            if child.returncode != 0:
                sys.exit(f"bench-rounds: a daemon failed, see {run}")
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                child.wait()
    worst = 0.0
    for i in range(nodes):
        ends = {}
        for line in open(os.path.join(run, f"n{i}.jsonl")):
            record = json.loads(line)
            if "duration_ms" in record:
                ends[record["round"]] = record["t"]
        first, last = WARMUP - 1, WARMUP - 1 + measured
        worst = max(worst, (ends[last] - ends[first]) / measured)
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--baseline", help="exchange_bench JSON (not with --attach or --against)")
    parser.add_argument("--work", required=True)
    parser.add_argument("--sizes", default="64K,1M,16M")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--attach", action="store_true",
                        help="a zero-update trainer per daemon against model.kind: none")
    parser.add_argument("--peers", action="store_true",
                        help="MPI (TCP) and gloo running the same exchange, side by side")
    parser.add_argument("--mpi", help="the compiled tests/bench/peers/mpi_exchange.c")
    parser.add_argument("--against", help="another build's bin folder: its consensusd beside this one")
    args = parser.parse_args()
    if args.attach:
        return attachment(args)
    if args.peers:
        return peers(args)
    if args.against:
        return against(args)
    print(f"{'P':>2} {'d':>2} {'model':>7} {'B_x GB/s':>9} {'B_m GB/s':>9} "
          f"{'T ms':>9} {'T_ref ms':>9} {'E':>6}")
    for size in map(parse_size, args.sizes.split(",")):
        for shape in SHAPES:
            nodes, degree, _ = shape
            times = [launch(args, shape, size, a) for a in range(args.launches)]
            t = statistics.median(times)
            b_x, b_m, t_ref = reference(args, shape, size)
            print(f"{nodes:>2} {degree:>2} {label_of(size):>7} {b_x / 1e9:9.2f} {b_m / 1e9:9.2f} "
                  f"{t * 1e3:9.2f} {t_ref * 1e3:9.2f} {t_ref / t:6.2f}", flush=True)


def reference(args, shape, size):
    """B_x, B_m and T_ref = P m (d / B_x + (d + 3) / B_m) from exchange_bench's run."""
    nodes, degree, _ = shape
    zmq, mix = baseline(args.baseline)
    b_x, b_m = zmq[size], mix[(size, degree)]
    return b_x, b_m, nodes * size * (degree / b_x + (degree + 3) / b_m)


def neighbour_file(run, topology):
    """Each node's neighbours by index, one line per node, from the topology's edges."""
    text = open(topology).read()
    nodes = len(re.findall(r"\{id: n\d+", text))
    neighbours = [[] for _ in range(nodes)]
    for a, b in re.findall(r"\[n(\d+), n(\d+)\]", text.split("edges:", 1)[1]):
        neighbours[int(a)].append(int(b))
        neighbours[int(b)].append(int(a))
    path = os.path.join(run, "neighbours.txt")
    with open(path, "w") as f:
        f.writelines(" ".join(map(str, sorted(n))) + "\n" for n in neighbours)
    return path


def peer_launch(args, shape, size, attempt, peer):
    """One MPI or gloo run of the same exchange on the same graph: mean round ms."""
    nodes, degree, gen = shape
    run = os.path.join(args.work, f"{peer}-p{nodes}-d{degree}-{size}-{attempt}")
    os.makedirs(run)
    topology = os.path.join(run, "topology.yaml")
    subprocess.run([os.path.join(args.bin, "consensusctl"), "topology", "gen", *gen, "--nodes",
                    str(nodes), "-o", topology], check=True)
    neighbours = neighbour_file(run, topology)
    measured = measured_rounds(size)
    common = [str(size), str(measured), str(WARMUP), neighbours]
    if peer in ("mpi", "mpi-shm"):
        btl = "tcp,self" if peer == "mpi" else "vader,self"  # vader: OpenMPI's shared memory
        argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(nodes),
                "--mca", "pml", "ob1", "--mca", "btl", btl, args.mpi, *common]
        out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=600).stdout
        return float(out.split()[-1]) / 1e3
    port = 29500 + attempt
    ranks = [subprocess.Popen(["/usr/bin/python3", GLOO_EXCHANGE, str(r), str(nodes), str(port),
                               *common], stdout=subprocess.PIPE, text=True)
             for r in range(nodes)]
    try:
        out = ranks[0].communicate(timeout=600)[0]
        for r in ranks[1:]:
            r.wait(timeout=60)
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
    return float(out.split()[-1]) / 1e3


def label_of(size):
    return f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"


def peers(args):
    """consensusd against MPI (TCP) and gloo on the same exchange, one run;
    then consensusd over ipc:// against MPI over shared memory (vader). E and
    E MPI: T_ref over consensusd's and MPI-TCP's time (the same reference)."""
    print(f"{'P':>2} {'d':>2} {'model':>7} {'MPI-TCP ms':>11} {'gloo ms':>9} {'consensusd ms':>14} "
          f"{'/ MPI':>6} {'/ gloo':>7} {'E':>5} {'E MPI':>6} {'MPI-shm ms':>11} {'ipc ms':>8} "
          f"{'/ MPI-shm':>10}")
    for size in map(parse_size, args.sizes.split(",")):
        for shape in SHAPES:
            nodes, degree, _ = shape
            mpi, gloo, ours, shm, ipc = [], [], [], [], []
            for a in range(args.launches):  # interleaved: drifts in the machine hit all five
                mpi.append(peer_launch(args, shape, size, a, "mpi"))
                gloo.append(peer_launch(args, shape, size, a, "gloo"))
                ours.append(launch(args, shape, size, a))
                shm.append(peer_launch(args, shape, size, a, "mpi-shm"))
                ipc.append(launch(args, shape, size, a, ipc=True))
            t_mpi, t_gloo, t, t_shm, t_ipc = (statistics.median(v) for v in (mpi, gloo, ours, shm, ipc))
            t_ref = reference(args, shape, size)[2]
            print(f"{nodes:>2} {degree:>2} {label_of(size):>7} {t_mpi * 1e3:11.2f} {t_gloo * 1e3:9.2f} "
                  f"{t * 1e3:14.2f} {t / t_mpi:6.2f} {t / t_gloo:7.2f} {t_ref / t:5.2f} "
                  f"{t_ref / t_mpi:6.2f} {t_shm * 1e3:11.2f} "
                  f"{t_ipc * 1e3:8.2f} {t_ipc / t_shm:10.2f}", flush=True)


def against(args):
    """This build's consensusd beside another's (--against), launches interleaved."""
    print(f"{'P':>2} {'d':>2} {'model':>7} {'other ms':>9} {'this ms':>9} {'ratio':>6}")
    for size in map(parse_size, args.sizes.split(",")):
        for shape in SHAPES:
            other, this = [], []
            for a in range(args.launches):
                other.append(launch(args, shape, size, a, binary=args.against))
                this.append(launch(args, shape, size, a))
            t_other, t_this = statistics.median(other), statistics.median(this)
            print(f"{shape[0]:>2} {shape[1]:>2} {label_of(size):>7} {t_other * 1e3:9.2f} "
                  f"{t_this * 1e3:9.2f} {t_this / t_other:6.2f}", flush=True)


def attachment(args):
    """The trainer socket's cost: rounds with a zero-update trainer attached to
    every daemon against the same rounds with no model, launches interleaved."""
    shape = SHAPES[0]
    print(f"{'P':>2} {'d':>2} {'model':>7} {'none ms':>9} {'trainer ms':>11} {'ratio':>6}")
    for size in map(parse_size, args.sizes.split(",")):
        none, attached = [], []
        for a in range(args.launches):
            none.append(launch(args, shape, size, a))
            attached.append(launch(args, shape, size, a, attach=True))
        t_none, t_attached = statistics.median(none), statistics.median(attached)
        print(f"{shape[0]:>2} {shape[1]:>2} {label_of(size):>7} {t_none * 1e3:9.2f} {t_attached * 1e3:11.2f} "
              f"{t_attached / t_none:6.2f}", flush=True)


if __name__ == "__main__":
    main()
