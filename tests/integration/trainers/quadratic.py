"""A numpy trainer for integration tests: node i minimises 0.5 ||x - t_i||^2,
t_i[j] = i + j / dimension, so the network's optimum is the mean of the t_i.

usage: quadratic.py SOCKET NODE DIMENSION [--delta LR] [--nan-at ROUND]
                    [--nan-loss-at ROUND] [--recover] [--rounds N]
                    [--dtype float32|float64] [--reconnect]
Prints one JSON line per round taken: {"round", "loss", "x0"}; with --recover
a rejected update prints {"rejected"} and the round is submitted again
clean. Exits 0 after --rounds rounds, or when the node finished training,
printing {"finished": REASON, "x0": its final x[0]}.
"""

import argparse
import json
import sys

import numpy as np

import consensusd


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("node", type=int)
    parser.add_argument("dimension", type=int)
    parser.add_argument("--delta", type=float, default=0.0,
                        help="step with this learning rate here and hand back the delta")
    parser.add_argument("--nan-at", type=int, default=-1, help="a NaN in this round's update")
    parser.add_argument("--nan-loss-at", type=int, default=-1, help="a NaN loss in this round")
    parser.add_argument("--recover", action="store_true",
                        help="submit a rejected round again, clean, and go on")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--reconnect", action="store_true",
                        help="attach again when the daemon restarts")
    args = parser.parse_args()

    target = args.node + np.arange(args.dimension) / args.dimension
    init = np.zeros(args.dimension)
    done = 0
    try:
        with consensusd.attach(args.socket, args.dimension, args.dtype, init=init,
                               reconnect=args.reconnect) as node:
            for round in node.rounds():
                x = np.array(round.params, dtype=np.float64)
                gradient = x - target
                loss = 0.5 * float(gradient @ gradient)
                bad_update = round.index == args.nan_at
                bad_loss = round.index == args.nan_loss_at
                try:
                    submit(round, gradient, loss, args.delta, bad_update, bad_loss)
                except consensusd.UpdateRejected as e:
                    if not args.recover:
                        raise
                    print(json.dumps({"rejected": str(e)}), flush=True)
                    submit(round, gradient, loss, args.delta, False, False)
                print(json.dumps({"round": round.index, "loss": loss, "x0": float(x[0])}),
                      flush=True)
                done += 1
                if args.rounds and done >= args.rounds:
                    return 0
            print(json.dumps({"finished": node.finished, "x0": float(node.params[0])}),
                  flush=True)
    except consensusd.UpdateRejected as e:
        print(json.dumps({"rejected": str(e)}), flush=True)
        return 3
    except consensusd.DaemonError as e:
        print(json.dumps({"daemon_error": str(e)}), flush=True)
        return 2
    return 0


def submit(round, gradient, loss, delta, bad_update, bad_loss):
    if bad_update:
        gradient = gradient.copy()
        gradient[0] = np.nan
    if bad_loss:
        loss = float("nan")
    if delta > 0:
        round.submit(-delta * gradient, loss=loss, kind="delta")
    else:
        round.submit(gradient, loss=loss)


if __name__ == "__main__":
    sys.exit(main())
