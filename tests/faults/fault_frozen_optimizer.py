"""Fault: the optimizer is given the frozen backbone's parameters instead of the head's.

Fine-tuning a head on a frozen backbone, with ``SGD(model.backbone.parameters())`` by mistake:
every ``step()`` is a no-op and the head never trains (TrainCheck: optimizer over frozen params).
Expected: ``optimizer_noop`` (and the head reported as ``unowned_parameters``, info).
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step
from torch import nn


def train(run: Run) -> None:
    model = nn.Sequential()
    model.add_module("backbone", mlp((8, 32, 16)))
    model.add_module("head", nn.Linear(16, 1))
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(model.backbone.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for _, batch in batches(20):
        train_step(model, optimizer, batch)


CASE = Case("fault_frozen_optimizer", train, expect=("optimizer_noop",), trigger=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
