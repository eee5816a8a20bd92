"""Healthy: a DataLoader with two persistent, properly seeded workers (torch's default seeding),
shuffled, four epochs of ~40 ms steps (8 s). Host memory rises while the workers start and the
prefetch queues and the allocator's pools fill, then stays flat: no ``memory_growth`` (nor any
other warning), although memory is read every step, long enough for a slope to show.

Not 10 or 20 ms steps: handing one batch from a worker to the loop (its tensors' shared memory
passed over a socket) costs the loop 2-8 ms on a small shared machine, and 10-14 ms a batch over
20 steps when the suite loads it, half of a 20 ms step; ``data_bottleneck`` then rightly says so.
"""

import torch
from _harness import Case, Procedural, Run, backward, main, mlp, paced
from torch.utils.data import DataLoader

BATCH = 32
EPOCHS = 4
STEP_S = 0.04


def train(run: Run) -> None:
    model = mlp((8, 64, 64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, manual=True)
    loader = DataLoader(Procedural(50 * BATCH), batch_size=BATCH, shuffle=True, num_workers=2,
                        persistent_workers=True)
    for _ in range(EPOCHS):
        for batch in paced(run.track_data(loader), STEP_S):
            optimizer.zero_grad()
            loss = backward(model, batch)
            optimizer.step()
            run.step(loss, samples=BATCH)


CASE = Case("healthy_dataloader_workers", train, step_s=STEP_S)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
