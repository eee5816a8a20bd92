"""Healthy: mixed precision with CPU autocast to bfloat16 (float32 parameters and gradients)."""

import torch
from _harness import Case, Run, batches, main, mlp
from torch import nn


def train(run: Run) -> None:
    model = mlp((8, 64, 64, 1), dropout=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for _, (x, y) in batches(30):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        optimizer.step()


CASE = Case("healthy_autocast", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
