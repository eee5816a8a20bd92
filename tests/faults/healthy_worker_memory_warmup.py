"""Healthy: a convolutional model fed image batches by a DataLoader with two persistent workers
(prefetching four batches each, 32 3x64x64 images a batch). For its first sixty-odd steps the
training process's resident set climbs by about 100 MiB, in steps of 16-40 MiB, reading after
reading: the allocator's arenas grow to the working set of forward and backward (activation maps
of 16 MiB), shared-memory batches from the workers are mapped, the optimizer's momentum buffers
are created. Then it stays flat for the rest of the run. That is bounded growth that stops, not a
leak: no ``memory_growth`` (nor any other warning). Before the detector read memory as floors
against a leak budget, this run raised ``memory_growth`` at step 60.
"""

import torch
from _harness import Case, Images, Run, main, release_free_memory
from torch import nn
from torch.utils.data import DataLoader

BATCH = 32
STEPS = 100


def train(run: Run) -> None:
    release_free_memory()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16 * 16, 256), nn.ReLU(), nn.Linear(256, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    run.watch([optimizer], model, manual=True)
    loader = DataLoader(Images(STEPS * BATCH), batch_size=BATCH, num_workers=2, persistent_workers=True,
                        prefetch_factor=4)
    for x, y in run.track_data(loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        run.step(loss, samples=BATCH)


CASE = Case("healthy_worker_memory_warmup", train, own_process=True)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
