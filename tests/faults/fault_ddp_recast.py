"""Fault (2 gloo processes): the DDP-wrapped model is re-cast with ``.double()`` at step 6.

DDP's reducer keeps hooks and buckets for the float32 tensors; after the cast the float64
gradients are never all-reduced, so the replicas drift apart silently (TrainCheck: DDP model
re-cast after wrapping). Expected: ``replica_divergence``.
"""

import torch
from _harness import Case, Run, backward, batches, ddp, main, mlp

TRIGGER = 6


def train(run: Run) -> None:
    model = ddp(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for step, (x, y) in batches(25, seed=run.rank):
        if step == TRIGGER:
            model.double()
        if step >= TRIGGER:
            x, y = x.double(), y.double()
        optimizer.zero_grad()
        backward(model, (x, y))
        optimizer.step()


CASE = Case("fault_ddp_recast", train, expect=("replica_divergence",), trigger=TRIGGER, within=10,
            world_size=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
