"""Healthy (2 gloo processes): plain DDP, each rank on its own data. Expected: no alarm, and the
replica check reports ``ok`` (it really compared)."""

import torch
from _harness import Case, Run, batches, ddp, main, mlp, train_step


def train(run: Run) -> None:
    model = ddp(mlp((8, 32, 32, 1), dropout=0.1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for _, batch in batches(25, seed=run.rank):
        train_step(model, optimizer, batch)


CASE = Case("healthy_ddp", train, world_size=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
