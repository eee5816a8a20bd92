"""Healthy: batch-norm statistics frozen on purpose (each BatchNorm layer put in eval() while the
rest of the model, BN affine parameters included, trains)."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step
from torch import nn


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1), dropout=0.1, batch_norm=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    run.watch([optimizer], model)
    for _, batch in batches(30, batch=4):
        model.train()
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.eval()
        train_step(model, optimizer, batch)


CASE = Case("healthy_frozen_norm_stats", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
