"""Plain two-process training on CPU (gloo, torch.multiprocessing.spawn; no tuimon code) in which
rank 1's data fetch blocks for a while, outside any collective, while rank 0 waits for it in the
gradient all-reduce.

    python plain_gloo_blocked_rank.py INIT_FILE STALL_S {ddp,manual}

``ddp``: DistributedDataParallel (rank 0 waits inside ``loss.backward()``, where DDP's all-reduce
completes); ``manual``: gradients averaged with ``dist.all_reduce`` (rank 0 waits in it). Rank 1
prints ``BLOCK <unix time>`` as its fetch starts blocking.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

BLOCK_AT = 30  # the loop iteration whose fetch blocks on rank 1
STEPS = 60


def fetch_shard(rank: int, step: int, generator: torch.Generator, stall_s: float) -> torch.Tensor:
    if rank == 1 and step == BLOCK_AT:
        print(f"BLOCK {time.time()}", flush=True)
        time.sleep(stall_s)  # a read from a shared file system that hangs
    return torch.randn(16, 8, generator=generator)


def worker(rank: int, init_file: str, stall_s: float, mode: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Linear(8, 1)
    if mode == "ddp":
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        batch = fetch_shard(rank, step, generator, stall_s)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if mode == "manual":
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= 2
        optimizer.step()
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(os.path.abspath(sys.argv[1]), float(sys.argv[2]), sys.argv[3]), nprocs=2)
