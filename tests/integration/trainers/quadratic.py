"""A numpy trainer for integration tests: node i minimises 0.5 ||x - t_i||^2,
t_i[j] = i + j / dimension, so the network's optimum is the mean of the t_i.

usage: quadratic.py SOCKET NODE DIMENSION [--delta LR] [--nan-at ROUND]
                    [--rounds N] [--dtype float32|float64] [--reconnect]
Prints one JSON line per round: {"round", "loss", "x0"}; exits 0 when the
daemon goes away or after --rounds rounds.
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
    parser.add_argument("--nan-at", type=int, default=-1)
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
                x = np.asarray(round.params, dtype=np.float64)
                gradient = x - target
                loss = 0.5 * float(gradient @ gradient)
                if round.index == args.nan_at:
                    gradient = gradient.copy()
                    gradient[0] = np.nan
                if args.delta > 0:
                    round.submit(-args.delta * gradient, loss=loss, kind="delta")
                else:
                    round.submit(gradient, loss=loss)
                print(json.dumps({"round": round.index, "loss": loss, "x0": float(x[0])}),
                      flush=True)
                done += 1
                if args.rounds and done >= args.rounds:
                    return 0
    except consensusd.UpdateRejected as e:
        print(json.dumps({"rejected": str(e)}), flush=True)
        return 3
    except consensusd.DaemonError as e:
        print(json.dumps({"daemon_error": str(e)}), flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
