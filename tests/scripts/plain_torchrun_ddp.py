"""Plain DDP training on CPU (gloo) for `torchrun --nproc_per_node 2`; no tuimon code."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(dist.get_rank())
for _ in range(int(sys.argv[1])):
    loss = model(torch.randn(16, 8, generator=generator)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
