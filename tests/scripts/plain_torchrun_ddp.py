"""Plain DDP training on CPU (gloo) for `torchrun`; no tuimon code.

``--diverge-rank R --diverge-at S`` nudges rank R's weights after step S, outside the optimizer (as
a bit flip or a rank-local edit would): its replica drifts from the others'. ``--slow-rank R
--slow-by S`` makes rank R's forward S seconds slower (a slow device): DDP keeps every rank's step
time equal, the others waiting for it in the all-reduce.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--diverge-rank", type=int, default=-1)
parser.add_argument("--diverge-at", type=int, default=-1)
parser.add_argument("--step-delay", type=float, default=0.0)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-by", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(dist.get_rank())
for step in range(1, args.steps + 1):
    loss = model(torch.randn(16, 8, generator=generator)).pow(2).mean()
    if dist.get_rank() == args.slow_rank:
        time.sleep(args.slow_by)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == args.diverge_at and dist.get_rank() == args.diverge_rank:
        with torch.no_grad():
            model.module.weight.add_(0.01)
    time.sleep(args.step_delay)
dist.destroy_process_group()
