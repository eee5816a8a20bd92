"""Fault (2 gloo processes): forward through the raw module instead of the DDP wrapper from step 6.

``ddp.module(x)`` skips DDP's gradient all-reduce: each rank steps on its own gradients and the
replicas drift apart while every rank's loss looks fine (TrainCheck: DDP forward through the raw
module). Expected: ``replica_divergence``.
"""

import torch
from _harness import Case, Run, backward, batches, ddp, main, mlp

TRIGGER = 6


def train(run: Run) -> None:
    model = ddp(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for step, batch in batches(25, seed=run.rank):
        optimizer.zero_grad()
        backward(model.module if step >= TRIGGER else model, batch)
        optimizer.step()


CASE = Case("fault_ddp_raw_forward", train, expect=("replica_divergence",), trigger=TRIGGER, within=10,
            world_size=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
