"""Plain two-process DDP training on CPU (gloo) started with torch.multiprocessing.spawn; no tuimon code."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, world_size: int, init_file: str, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        batch = torch.randn(16, 8, generator=generator)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    init_file = os.path.abspath(sys.argv[1])
    mp.spawn(worker, args=(2, init_file, int(sys.argv[2])), nprocs=2)
