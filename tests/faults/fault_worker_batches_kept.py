"""Fault: batches from DataLoader workers kept alive. From loop index 20 the loop keeps every
input batch "for a grid of examples at the end of the epoch" (``shown.append(x)``, meant to keep
eight images). Each batch a worker hands over lives in a shared-memory block that cannot be freed
while a tensor refers to it, so the training process's resident set grows by the batch, 1.5 MiB,
every step, whatever the workers do. Expected: ``memory_growth`` (host memory) before the process
grew by the leak budget (1 GiB or a tenth of the available memory) since the trigger.
"""

import torch
from _harness import Case, Images, Run, main, release_free_memory
from torch import nn
from torch.utils.data import DataLoader

BATCH = 32
STEPS = 260
TRIGGER = 20


def train(run: Run) -> None:
    release_free_memory()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    run.watch([optimizer], model, manual=True)
    loader = DataLoader(Images(STEPS * BATCH), batch_size=BATCH, num_workers=2, persistent_workers=True)
    shown = []
    for step, (x, y) in enumerate(run.track_data(loader)):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step >= TRIGGER:
            shown.append(x)  # the bug: every batch, and its shared-memory block, stays alive
        run.step(loss, samples=BATCH)


CASE = Case("fault_worker_batches_kept", train, expect=("memory_growth",), trigger=TRIGGER, within=10,
            within_s=1.0, own_process=True, leak=True)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
