"""Healthy: ``AdamW(fused=True)``, whose fused kernel updates parameters without bumping their
version counters (the checker must fall back to comparing values, not call the steps no-ops)."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1), dropout=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    run.watch([optimizer], model)
    for _, batch in batches(30):
        train_step(model, optimizer, batch)


CASE = Case("healthy_fused_optimizer", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
