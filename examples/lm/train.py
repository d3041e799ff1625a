#!/usr/bin/python3
"""A byte-level transformer on the King James Bible, trained as one
consensusd node (or alone).

As a node's trainer (the daemon runs with model.kind: external):

    /usr/bin/python3 examples/lm/train.py --socket RUN/n0.trainer.sock --node 0 --nodes 8 \\
        --steps 1600 --local-steps 16

Each node trains on its share of the text (corpus.py) with AdamW (training.py:
warm-up, cosine, clipping); consensusd.torch.Optimizer makes --local-steps
AdamW steps one round of the node, whose daemon mixes the delta with the
neighbours that answered in time and takes the outer step (train.outer;
DiLoCo's Nesterov in the comparisons). The daemon's train.rounds must be
--steps / --local-steps (times 1 + --mix-rounds). Node 0 measures the validation loss every
--eval-every steps (a multiple of --local-steps: at a round's x_k); every node
measures its final parameters on all the validation text. --sample N prints N bytes the final model writes.

Alone, on all the text (a check of the model and its schedule):

    /usr/bin/python3 examples/lm/train.py --single --steps 1600
"""

import argparse
import sys
import time

import numpy as np

import corpus
import model as lm
import training


def deltas(optimizer, args):
    """The deltas the node's rounds so far stand for (1 + --mix-rounds rounds each)."""
    return optimizer.round // (1 + args.mix_rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", help="the node's trainer socket (trainer.socket)")
    parser.add_argument("--node", type=int, default=0, help="this node's index: its share")
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes share the text")
    parser.add_argument("--single", action="store_true", help="train alone on all the text")
    parser.add_argument("--local-steps", type=int, default=1, help="AdamW steps per round")
    parser.add_argument("--mix-rounds", type=int, default=0,
                        help="rounds that only mix after each delta (consensusd.torch.Optimizer)")
    parser.add_argument("--outer-lr", type=float, default=1.0,
                        help="with --mix-rounds: the outer Nesterov step's rate (1: none)")
    parser.add_argument("--outer-momentum", type=float, default=0.0,
                        help="with --mix-rounds: its momentum (DiLoCo: 0.7 and 0.9)")
    parser.add_argument("--reconnect", action="store_true", help="ride out daemon restarts")
    parser.add_argument("--sample", type=int, default=0, help="bytes to sample at the end")
    training.add_arguments(parser)
    training.Straggler.add_arguments(parser)  # as the baselines' ranks emulate them
    args = parser.parse_args()
    if not args.single and not args.socket:
        parser.error("--socket is required (or --single)")
    if args.steps % args.local_steps:
        parser.error(f"--steps {args.steps} is not a multiple of --local-steps {args.local_steps}")

    model = training.setup(args)
    training.check_blas()
    text = corpus.training(0, 1) if args.single else corpus.training(args.node, args.nodes)
    validation = training.Validation(model.block, args.eval_windows, args.final_windows)
    rng = np.random.default_rng(1000 + args.node)
    straggler = training.Straggler(args, args.node)
    adamw = training.adamw(model.parameters(), args)
    print(f"{lm.parameters(model):,} parameters ({args.size}), {len(text):,} training bytes",
          flush=True)
    if args.single:
        optimizer = adamw
        step = 0
    else:
        import consensusd.torch
        optimizer = consensusd.torch.Optimizer(adamw, model, socket=args.socket, timeout=120,
                                               reconnect=args.reconnect,
                                               local_steps=args.local_steps,
                                               mix_rounds=args.mix_rounds,
                                               outer_lr=args.outer_lr,
                                               outer_momentum=args.outer_momentum)
        step = deltas(optimizer, args) * args.local_steps  # a resumed node goes on

    start = training.started()
    measure_every = args.eval_every or args.steps
    while step < args.steps:
        inputs, targets = corpus.batch(text, rng, args.batch, model.block)
        training.schedule(adamw, step, args)
        straggler.sleep()
        optimizer.zero_grad()
        loss = model.loss(inputs, targets)
        loss.backward()
        training.clip(model)
        test_loss = None
        if args.node == 0 and step > 0 and step % measure_every == 0:
            reached = time.monotonic() - start  # before the step: the parameters' time
            test_loss = validation.loss(model)
            training.report(step, loss.item(), test_loss, reached)
        if args.single:
            optimizer.step()
            step += 1
        elif optimizer.step(loss=loss.item(), test_loss=test_loss, samples=inputs.numel()):
            # the round's next step, or the next round's first
            step = deltas(optimizer, args) * args.local_steps + (step + 1) % args.local_steps
        else:
            print(f"the node finished training ({optimizer.finished}) at "
                  f"{time.monotonic() - start:.1f} s", flush=True)
            break
    # The final parameters (for a node, its daemon's last mix), on all the validation text.
    reached = time.monotonic() - start
    training.report(args.steps, loss.item(), validation.loss(model, whole=True), reached)
    if args.sample:
        text = model.generate(b"And", args.sample, np.random.default_rng(args.seed))
        print("sample:\n" + text.decode("ascii", "replace"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
