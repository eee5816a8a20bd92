"""Two gloo ranks with a Monitor each (CPU): rank 1 is late for an all_reduce, rank 0 waits in it.

    python monitored_gloo_stall.py RECORD_DIR PORT HANG_AFTER_S STALL_S

Each rank records to RECORD_DIR/rank<R>.jsonl. The heartbeats of the stall say where each rank is.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from publisher.monitor import Monitor


def rank_one_is_late(stall_s: float) -> None:
    time.sleep(stall_s)


def train(mon: Monitor, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        loss = model(torch.randn(16, 8, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():  # data parallelism by hand: average the gradients
            dist.all_reduce(param.grad)
            param.grad /= 2
        optimizer.step()
        mon.step(loss)


def worker(rank: int, record_dir: str, port: int, hang_after_s: float, stall_s: float) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Monitor(model, optimizer, run="gloo-stall", rank=rank, world_size=2, gpu="none",
                 record=Path(record_dir) / f"rank{rank}.jsonl", hang_after_s=hang_after_s,
                 invariants=False, stats=False) as mon:
        train(mon, model, optimizer, 20)
        if rank == 1:
            rank_one_is_late(stall_s)
        dist.all_reduce(torch.ones(1))
        train(mon, model, optimizer, 20)
    dist.destroy_process_group()


if __name__ == "__main__":
    record_dir, port, hang_after_s, stall_s = sys.argv[1:5]
    mp.spawn(worker, args=(record_dir, int(port), float(hang_after_s), float(stall_s)), nprocs=2)
