"""The exchange consensusd's rounds do, with torch.distributed (gloo)
isend/irecv: each round every rank sends its float32 vector to each
neighbour, receives theirs, and averages. scripts/bench-rounds --peers starts
one process per rank beside consensusd on the same graph.

    /usr/bin/python3 gloo_exchange.py RANK WORLD PORT BYTES ROUNDS WARMUP NEIGHBOURS_FILE

Prints, on rank 0, the mean round time after WARMUP rounds in ms, the
maximum over ranks.
"""
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank, world, port, size, rounds, warmup = map(int, sys.argv[1:7])
    with open(sys.argv[7]) as f:
        neighbours = [int(j) for j in f.read().splitlines()[rank].split()]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    n = size // 4
    x = torch.full((n,), float(rank))
    inbox = [torch.zeros(n) for _ in neighbours]
    start = 0.0
    for r in range(warmup + rounds):
        if r == warmup:
            dist.barrier()
            start = time.perf_counter()
        requests = [dist.irecv(inbox[i], j) for i, j in enumerate(neighbours)]
        requests += [dist.isend(x, j) for j in neighbours]
        for request in requests:
            request.wait()
        total = x.clone()
        for received in inbox:
            total += received
        x = total / (len(neighbours) + 1)
    mean = torch.tensor([(time.perf_counter() - start) / rounds])
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("%.4f" % (mean.item() * 1e3), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
