"""A trainer that computes nothing: each round it hands back the update slot as
it is (zeros), with no copy. scripts/bench-rounds --attach measures the
daemon's trainer path with it against model.kind: none.

    PYTHONPATH=python /usr/bin/python3 tests/bench/zero_trainer.py SOCKET DIMENSION
"""
import sys

import numpy as np

import consensusd


def main():
    path, dimension = sys.argv[1], int(sys.argv[2])
    with consensusd.attach(path, dimension, "float32", init=np.zeros(dimension, np.float32),
                           timeout=60) as node:
        for round_ in node.rounds():  # until the daemon reaches train.rounds
            round_.submit(None, loss=0.0)


if __name__ == "__main__":
    main()
