"""Healthy: batches of 2 with noisy targets and a small learning rate (tiny, erratic updates)."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    run.watch([optimizer], model)
    for _, batch in batches(40, batch=2, noise=1.0):
        train_step(model, optimizer, batch)


CASE = Case("healthy_small_batches", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
