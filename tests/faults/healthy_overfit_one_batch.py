"""Healthy: the overfit-one-batch sanity check (can the model drive the loss of a single batch
towards zero? if not, the model or the loss is broken), which says what it is doing:
``Monitor(repeated_batches=True)``. The same batch every step, through the Monitor's data timing:
no ``duplicate_batches`` (nor any other warning).
"""

import itertools

import torch
from _harness import Case, Run, classify, labelled, main, mlp

STEPS = 60


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    run.watch([optimizer], model, repeated_batches=True)
    _, batch = next(labelled(1))
    for one in run.track_data(itertools.repeat(batch, STEPS)):
        optimizer.zero_grad()
        classify(model, one)
        optimizer.step()


CASE = Case("healthy_overfit_one_batch", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
