"""Healthy: fine-tuning a head on a frozen backbone kept in eval() (BatchNorm and Dropout inside),
the optimizer built over the trainable parameters only."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step
from torch import nn


def train(run: Run) -> None:
    model = nn.Sequential()
    model.add_module("backbone", mlp((8, 32, 16), dropout=0.2, batch_norm=True))
    model.add_module("head", nn.Sequential(nn.Dropout(0.1), nn.Linear(16, 1)))
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    run.watch([optimizer], model)
    for _, batch in batches(30):
        model.train()
        model.backbone.eval()
        train_step(model, optimizer, batch)


CASE = Case("healthy_frozen_backbone", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
