"""Two gloo ranks under DistributedDataParallel, a Monitor each (CPU); rank 1 starts every backward
0.3 s late, so rank 0's backward() waits for it inside DDP's end-of-backward all-reduce.

    python monitored_ddp_late_rank.py RECORD_DIR

Each rank records to RECORD_DIR/rank<R>.jsonl. Rank 0's ``compute_time`` must leave that wait out
(its ``step_time`` holds it): the straggler is told by compute time, not by step time.
"""

import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from publisher.monitor import Monitor

STEPS = 6
LATE_S = 0.3


def worker(rank: int, record_dir: str, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    with Monitor(model, optimizer, run="ddp-late", rank=rank, world_size=2, gpu="none",
                 record=Path(record_dir) / f"rank{rank}.jsonl") as mon:
        for _ in range(STEPS):
            loss = ddp(torch.randn(16, 32)).pow(2).mean()
            if rank == 1:
                time.sleep(LATE_S)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.step(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(worker, args=(sys.argv[1], str(Path(scratch) / "rendezvous")), nprocs=2)
