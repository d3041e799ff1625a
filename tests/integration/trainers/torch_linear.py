"""A PyTorch trainer for integration tests: linear regression y = w.x + b_i
with w = (1, -2, 3, 0.5) on every node and b_i = node / 10, Adam through
consensusd.torch.Optimizer. The network's optimum: w, and b = the mean b_i.

usage: torch_linear.py SOCKET NODE [LOCAL_STEPS] [--nodes N] [--pause-at STEP --until FILE]
--nodes N: consensusd.torch.Adam for N nodes instead of torch's Adam;
--pause-at: before that step (counted from 1) wait until FILE exists, so
that the node's neighbours run ahead and the node skips rounds.
Prints {"finished", "steps", "weight", "bias", "jumps", "moved"} when the node
finishes training: the model then holds the node's final parameters; jumps:
how often the round index went up by more than one, moved: how often the
optimizer was told (consensusd.torch.Adam's moved()).
"""

import argparse
import json
import os
import sys
import time

import torch

import consensusd.torch


class CountingAdam(consensusd.torch.Adam):
    """consensusd.torch.Adam that counts the wrapper's moved() calls."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.moved_calls = 0

    def moved(self):
        self.moved_calls += 1
        super().moved()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("node", type=int)
    parser.add_argument("local_steps", type=int, nargs="?", default=1)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--mix-rounds", type=int, default=0)
    parser.add_argument("--outer", type=float, nargs=2, default=(1.0, 0.0),
                        metavar=("LR", "MOMENTUM"))
    parser.add_argument("--pause-at", type=int)
    parser.add_argument("--until")
    args = parser.parse_args()
    torch.manual_seed(1)  # the same initialisation on every node
    model = torch.nn.Linear(4, 1)
    torch.manual_seed(100 + args.node)  # each node's own data
    weight = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    if args.nodes:
        adam = CountingAdam(model.parameters(), lr=0.05, nodes=args.nodes)
    else:
        adam = torch.optim.Adam(model.parameters(), lr=0.05)
    opt = consensusd.torch.Optimizer(adam, model, args.socket, local_steps=args.local_steps,
                                     mix_rounds=args.mix_rounds, outer_lr=args.outer[0],
                                     outer_momentum=args.outer[1])
    steps = jumps = 0
    last = opt.round
    training = True
    while training:
        if steps + 1 == args.pause_at:
            while not os.path.exists(args.until):
                time.sleep(0.05)
        inputs = torch.randn(32, 4)
        targets = inputs @ weight.T + args.node / 10
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        training = opt.step(loss=loss.item(), samples=len(inputs))
        steps += 1
        if training:
            jumps += opt.round > last + 1
            last = opt.round
    print(json.dumps({"finished": opt.finished, "steps": steps,
                      "weight": model.weight.data[0].tolist(), "bias": model.bias.item(),
                      "jumps": jumps, "moved": getattr(adam, "moved_calls", None)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
