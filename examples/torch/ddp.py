#!/usr/bin/python3
"""The same CNN, data deal and Adam schedule as train.py, under torch
DistributedDataParallel (gloo): what a PyTorch user would run instead of
consensusd, for the comparisons in docs/performance.md.

One process per rank; every step all-reduces the gradients (an exact average
over all ranks, waiting for the slowest):

    /usr/bin/python3 examples/torch/ddp.py --rank 0 --world 8 --master 10.77.0.1 --steps 1000

Rank i trains on train.py's share i (batches of 32, its own draws), Adam
2e-3 on a cosine to 0 at --steps. --fp16 compresses the all-reduce with
DDP's fp16 hook. Emulated stragglers take the daemon's straggler models'
draws' distribution (not their exact draws): --bimodal P:FACTOR:BASE_MS
sleeps (FACTOR - 1) x BASE_MS with probability P each step, --delay-ms D
sleeps D every step, --pareto SCALE_MS:SHAPE sleeps a Pareto draw (at
least SCALE_MS, tail index SHAPE) every step. Rank 0 measures the model (the same on every rank)
every --eval-every steps on --eval-samples test images, and on all 10,000
at the end, printing lines as train.py does.
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import fashion_mnist
from train import cnn, evaluate, share


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-samples", type=int, default=2000)
    parser.add_argument("--fp16", action="store_true", help="DDP's fp16 compression hook")
    parser.add_argument("--bimodal", help="P:FACTOR:BASE_MS, as straggler.kind: bimodal")
    parser.add_argument("--pareto", help="SCALE_MS:SHAPE, as straggler.kind: pareto")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="as straggler.kind: constant")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0" if args.master != "127.0.0.1" else "lo")
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=args.rank, world_size=args.world)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(cnn())
    if args.fp16:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    images, labels = fashion_mnist.load("train")
    test_images, test_labels = (torch.from_numpy(a) for a in fashion_mnist.load("t10k"))
    mine = share(len(images), args.rank, args.world, seed=args.seed)
    images, labels = torch.from_numpy(images[mine]), torch.from_numpy(labels[mine])
    rng = np.random.default_rng(1000 + args.rank)
    slow = np.random.default_rng(7919 + args.rank)  # the straggler's own draws
    bimodal = [float(x) for x in args.bimodal.split(":")] if args.bimodal else None
    pareto = [float(x) for x in args.pareto.split(":")] if args.pareto else None
    adam = torch.optim.Adam(model.parameters(), lr=args.lr)

    start = time.monotonic()
    for step in range(args.steps):
        batch = torch.from_numpy(rng.integers(0, len(images), args.batch))
        for group in adam.param_groups:
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        extra = args.delay_ms
        if bimodal and slow.random() < bimodal[0]:
            extra += (bimodal[1] - 1) * bimodal[2]
        if pareto:  # inverse CDF, u in (0, 1]: scale / u^(1/shape)
            extra += pareto[0] * (1.0 - slow.random()) ** (-1.0 / pareto[1])
        if extra > 0:
            time.sleep(extra / 1000)
        adam.zero_grad()
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()  # the all-reduce
        adam.step()
        last = step == args.steps - 1
        if args.rank == 0 and (last or (step + 1) % args.eval_every == 0):
            every = 1 if last else max(1, len(test_images) // args.eval_samples)
            reached = time.monotonic() - start  # the parameters' time, not the evaluation's
            accuracy, _ = evaluate(model.module, test_images[::every], test_labels[::every])
            print(f"round {step + 1}  loss {loss.item():.4f}  test acc {accuracy:.4f}  "
                  f"{reached:.1f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
