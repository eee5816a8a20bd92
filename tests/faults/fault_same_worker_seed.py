"""Fault: every DataLoader worker seeded with the same constant. The data set makes its samples
from the random generator (synthetic data, random augmentation); a ``worker_init_fn`` meant to make
the run reproducible seeds torch, numpy and ``random`` with 1234 in every worker instead of
``1234 + worker_id``. The two workers yield byte-identical batches (the second batch repeats the
first, the fourth the third...) and, as the workers start afresh each epoch, every epoch repeats
the previous one: however long the run, it trains on the half epoch of distinct batches it saw
first. Expected: ``duplicate_batches`` within 2 steps of the first repeated batch (loop index 1).
"""

import random

import numpy as np
import torch
from _harness import Case, Procedural, Run, backward, main, mlp
from torch.utils.data import DataLoader

SEED = 1234
BATCH = 16
EPOCHS = 3


def seed_worker(worker_id: int) -> None:
    """The bug: the same seed in every worker (``SEED + worker_id`` was meant)."""
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    random.seed(SEED)


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, manual=True)
    loader = DataLoader(Procedural(8 * BATCH), batch_size=BATCH, shuffle=True, num_workers=2,
                        worker_init_fn=seed_worker)
    for _ in range(EPOCHS):
        for batch in run.track_data(loader):
            optimizer.zero_grad()
            loss = backward(model, batch)
            optimizer.step()
            run.step(loss, samples=BATCH)


CASE = Case("fault_same_worker_seed", train, expect=("duplicate_batches",), trigger=1, within=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
