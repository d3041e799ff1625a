#!/usr/bin/python3
"""The language model of train.py under the two baselines a reader of this
field compares with, torch.distributed over gloo, one process per rank:

  ddp      DistributedDataParallel: every step all-reduces the gradients
           (an exact average over all ranks, waiting for the slowest).
  diloco   DiLoCo (Douillard et al. 2023, arXiv 2311.08105): --local-steps
           AdamW steps on each rank, then an all-reduce of the pseudo-gradient
           (the global parameters minus the rank's) and an outer Nesterov
           step on the global parameters (lr --outer-lr 0.7, momentum
           --outer-momentum 0.9, the paper's); every rank goes on from them,
           keeping its AdamW state.

    /usr/bin/python3 examples/lm/baselines.py ddp --rank 0 --world 8 --master 127.0.0.1

Rank i trains on train.py's share i with the same x_0, batches, AdamW and
schedule (training.py). Emulated stragglers sleep before a step (the
daemon's models' distributions, each rank its own draws). Rank 0 measures
the validation loss every --eval-every steps and on all the validation text
at the end, printing train.py's lines, and the bytes it sent by the
all-reduce's count ("all-reduces N of B bytes").
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import parameters_to_vector

import corpus
import model as lm
import training


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithm", choices=["ddp", "diloco"])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("--local-steps", type=int, default=16, help="diloco: inner steps")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="diloco: outer learning rate")
    parser.add_argument("--outer-momentum", type=float, default=0.9, help="diloco: Nesterov's")
    training.add_arguments(parser)
    training.Straggler.add_arguments(parser)
    args = parser.parse_args()
    local_steps = args.local_steps if args.algorithm == "diloco" else 1
    if args.steps % local_steps:
        parser.error(f"--steps {args.steps} is not a multiple of --local-steps {local_steps}")

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0" if args.master != "127.0.0.1" else "lo")
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=args.rank, world_size=args.world)
    model = training.setup(args)
    if args.rank == 0:
        training.check_blas()
    text = corpus.training(args.rank, args.world)
    validation = (training.Validation(model.block, args.eval_windows, args.final_windows)
                  if args.rank == 0 else None)
    rng = np.random.default_rng(1000 + args.rank)
    straggler = training.Straggler(args, args.rank)
    size = lm.parameters(model)
    if args.algorithm == "ddp":
        trained = DistributedDataParallel(model)
        outer = None
    else:
        trained = model
        params = list(model.parameters())
        global_params = [p.detach().clone().requires_grad_(True) for p in params]
        outer = torch.optim.SGD(global_params, lr=args.outer_lr, momentum=args.outer_momentum,
                                nesterov=args.outer_momentum > 0)
    adamw = training.adamw(model.parameters(), args)
    reductions = 0

    start = training.started()
    loss = None
    for step in range(args.steps):
        if validation and step > 0 and args.eval_every and step % args.eval_every == 0:
            reached = time.monotonic() - start
            training.report(step, loss.item(), validation.loss(model), reached)
        inputs, targets = corpus.batch(text, rng, args.batch, model.block)
        training.schedule(adamw, step, args)
        straggler.sleep()
        adamw.zero_grad()
        loss = lm.cross_entropy(trained(inputs), targets)
        loss.backward()  # DDP: the all-reduce of the gradients
        training.clip(model)
        adamw.step()
        if outer is None:
            reductions += 1
        elif (step + 1) % local_steps == 0:
            with torch.no_grad():  # the pseudo-gradient, averaged: one all-reduce
                pseudo = parameters_to_vector(global_params) - parameters_to_vector(params)
                dist.all_reduce(pseudo)
                pseudo /= args.world
                offset = 0
                for g in global_params:
                    g.grad = pseudo[offset:offset + g.numel()].view_as(g).clone()
                    offset += g.numel()
            outer.step()
            with torch.no_grad():
                for p, g in zip(params, global_params):
                    p.copy_(g)
            reductions += 1
    if validation:
        reached = time.monotonic() - start
        training.report(args.steps, loss.item(), validation.loss(model, whole=True), reached)
        print(f"all-reduces {reductions} of {4 * size} bytes", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
