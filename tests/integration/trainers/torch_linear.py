"""A PyTorch trainer for integration tests: linear regression y = w.x + b_i
with w = (1, -2, 3, 0.5) on every node and b_i = node / 10, Adam through
consensusd.torch.Optimizer. The network's optimum: w, and b = the mean b_i.

usage: torch_linear.py SOCKET NODE [LOCAL_STEPS]
Prints {"finished", "steps", "weight", "bias"} when the node finishes training:
the model then holds the node's final parameters.
"""

import json
import sys

import torch

import consensusd.torch


def main():
    socket, node = sys.argv[1], int(sys.argv[2])
    local_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.manual_seed(1)  # the same initialisation on every node
    model = torch.nn.Linear(4, 1)
    torch.manual_seed(100 + node)  # each node's own data
    weight = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    opt = consensusd.torch.Optimizer(torch.optim.Adam(model.parameters(), lr=0.05), model, socket,
                                     local_steps=local_steps)
    steps = 0
    training = True
    while training:
        inputs = torch.randn(32, 4)
        targets = inputs @ weight.T + node / 10
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        training = opt.step(loss=loss.item(), samples=len(inputs))
        steps += 1
    print(json.dumps({"finished": opt.finished, "steps": steps,
                      "weight": model.weight.data[0].tolist(), "bias": model.bias.item()}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
