#!/usr/bin/python3
"""A small CNN on Fashion-MNIST, trained as one consensusd node (or alone).

As a node's trainer (the daemon runs with model.kind: external):

    /usr/bin/python3 examples/torch/train.py --socket RUN/n0.trainer.sock --node 0 --nodes 8

Each node trains on its own iid share of the 60,000 training images with its
own Adam, consensusd.torch.Adam (which steps as Adam on the nodes' mean
gradient; --adam local: torch's); consensusd.torch.Optimizer makes every
step one round of the node (the daemon mixes with the neighbours that
answered in time). Alone, on all
the data, as the baseline the demo compares with:

    /usr/bin/python3 examples/torch/train.py --single --rounds 1200 --batch 256

The data come from Debian's dataset-fashion-mnist (fashion_mnist.py); the
initialisation is seeded alike on every node (--seed), as a fresh start
needs. --state FILE keeps Adam's moments and the batch order across restarts
(the daemon keeps x; docs/trainers.md).
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

import fashion_mnist


def cnn():
    """Two 5x5 convolutions and two dense layers: 215,370 parameters."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def evaluate(model, images, labels):
    """(accuracy, mean cross-entropy) on a test set, in chunks."""
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(images), 2000):
            logits = model(images[start:start + 2000])
            target = labels[start:start + 2000]
            correct += int((logits.argmax(1) == target).sum())
            total_loss += float(nn.functional.cross_entropy(logits, target, reduction="sum"))
    return correct / len(images), total_loss / len(images)


def share(count, node, nodes, seed):
    """Node `node`'s iid share of `count` training samples (a seeded shuffle, dealt out)."""
    order = np.random.default_rng(seed).permutation(count)
    return order[node::nodes]


def save_state(path, optimizer, rng):
    """Adam's moments and the batch order, written whole or not at all."""
    temporary = path + ".tmp"
    torch.save({"optimizer": optimizer.state_dict(), "rng": rng.bit_generator.state}, temporary)
    os.replace(temporary, path)


def measure(args, model, test_images, test_labels, round_number, loss, last, start):
    """(accuracy, test loss) of the model, printed as the line comparisons read:
    every k-th test image (a spread sample) between, all of them at the last
    round; the time is when the parameters were reached, not the evaluation's."""
    every = 1 if last else max(1, len(test_images) // args.eval_samples)
    reached = time.monotonic() - start
    accuracy, test_loss = evaluate(model, test_images[::every], test_labels[::every])
    print(f"round {round_number}  loss {loss:.4f}  test acc {accuracy:.4f}  {reached:.1f} s",
          flush=True)
    return accuracy, test_loss


def daemon_sgd(args, model, images, labels, test_images, test_labels, rng):
    """--daemon-sgd: no optimizer here; each round hands the daemon the gradient
    at x_k and the daemon's own optimizer steps (train.learning_rate,
    train.momentum, train.schedule), as for its built-in models."""
    import consensusd
    from torch.nn.utils import parameters_to_vector, vector_to_parameters
    params = list(model.parameters())
    x0 = parameters_to_vector(params).detach().numpy()
    start = time.monotonic()
    print(f"first step at {time.time():.3f} (unix time)", flush=True)
    with consensusd.attach(args.socket, x0.size, "float32", init=x0, timeout=60) as node:
        for current in node.rounds():
            with torch.no_grad():
                vector_to_parameters(torch.from_numpy(np.array(current.params)), params)
            batch = torch.from_numpy(rng.integers(0, len(images), args.batch))
            model.zero_grad()
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            loss.backward()
            accuracy = test_loss = None
            last = current.index == args.rounds - 1
            if last or (current.index + 1) % args.eval_every == 0:
                accuracy, test_loss = measure(args, model, test_images, test_labels,
                                           current.index + 1, loss.item(), last, start)
            gradient = parameters_to_vector([p.grad for p in params]).detach().numpy()
            current.submit(gradient, loss=loss.item(), accuracy=accuracy, test_loss=test_loss,
                           samples=len(batch))
        print(f"the node finished training ({node.finished}) at "
              f"{time.monotonic() - start:.1f} s", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", help="the node's trainer socket (trainer.socket)")
    parser.add_argument("--node", type=int, default=0, help="this node's index: its data share")
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes share the data")
    parser.add_argument("--single", action="store_true", help="train alone on all the data")
    parser.add_argument("--rounds", type=int, default=1200,
                        help="the daemon's train.rounds (the last is measured on all test data)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3,
                        help="Adam's first learning rate (cosine decay to 0 at --rounds)")
    parser.add_argument("--seed", type=int, default=1, help="the model's initialisation")
    parser.add_argument("--eval-every", type=int, default=100, help="rounds between test runs")
    parser.add_argument("--eval-samples", type=int, default=2000,
                        help="test images used between (the last test uses all 10,000)")
    parser.add_argument("--state", help="keep Adam's state here (saved every --eval-every)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--reconnect", action="store_true", help="ride out daemon restarts")
    parser.add_argument("--daemon-sgd", action="store_true",
                        help="hand the daemon gradients; its optimizer steps (no Adam here)")
    parser.add_argument("--adam", choices=["cluster", "local"], default="cluster",
                        help="cluster: consensusd.torch.Adam, which steps as Adam on the "
                             "--nodes nodes' mean gradient; local: torch.optim.Adam")
    parser.add_argument("--local-steps", type=int, default=1,
                        help="Adam steps per round, one delta to the daemon (docs/trainers.md)")
    args = parser.parse_args()
    if not args.single and not args.socket:
        parser.error("--socket is required (or --single)")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the same x_0 on every node
    model = cnn()
    images, labels = fashion_mnist.load("train")
    test_images, test_labels = (torch.from_numpy(a) for a in fashion_mnist.load("t10k"))
    mine = share(len(images), args.node, args.nodes, seed=args.seed)
    images, labels = torch.from_numpy(images[mine]), torch.from_numpy(labels[mine])
    rng = np.random.default_rng(1000 + args.node)
    if args.daemon_sgd:
        return daemon_sgd(args, model, images, labels, test_images, test_labels, rng)
    if args.adam == "cluster" and not args.single:
        import consensusd.torch
        adam = consensusd.torch.Adam(model.parameters(), lr=args.lr, nodes=args.nodes)
    else:
        adam = torch.optim.Adam(model.parameters(), lr=args.lr)
    if args.state and os.path.exists(args.state):
        saved = torch.load(args.state)
        adam.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["rng"]

    if args.single:
        optimizer, first = adam, 0
    else:
        import consensusd.torch
        optimizer = consensusd.torch.Optimizer(adam, model, socket=args.socket, timeout=60,
                                               reconnect=args.reconnect,
                                               local_steps=args.local_steps)
        first = optimizer.round
    start = time.monotonic()
    # Wall-clock time of the first step: comparisons line several processes up by it.
    print(f"first step at {time.time():.3f} (unix time)", flush=True)
    round_ = first
    step = 0  # within the round: with --local-steps, the round's last is measured
    while round_ < args.rounds:
        batch = torch.from_numpy(rng.integers(0, len(images), args.batch))
        for group in adam.param_groups:  # from the round: a resumed node continues the decay
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * round_ / args.rounds))
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()
        accuracy = test_loss = None
        last = round_ == args.rounds - 1
        closes = args.single or step == args.local_steps - 1  # the step that ends the round
        if closes and (last or (round_ + 1) % args.eval_every == 0):  # before the step
            accuracy, test_loss = measure(args, model, test_images, test_labels, round_ + 1,
                                       loss.item(), last, start)
            if args.state:
                save_state(args.state, adam, rng)
        if args.single:
            optimizer.step()
            round_ += 1
        else:
            if not optimizer.step(loss=loss.item(), accuracy=accuracy, test_loss=test_loss,
                                  samples=len(batch)):
                print(f"the node finished training ({optimizer.finished}) at "
                      f"{time.monotonic() - start:.1f} s", flush=True)
                break  # the model holds the node's final parameters
            step = (step + 1) % args.local_steps
            round_ = optimizer.round
    if args.single:
        accuracy, _ = evaluate(model, test_images, test_labels)
        print(f"single: {args.rounds} steps of {args.batch}  test acc {accuracy:.4f}  "
              f"{time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
