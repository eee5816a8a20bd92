"""Fault (2 gloo processes): gradient clipping on rank 0 only, from step 6.

The clipping sits in a branch that only rank 0 takes (BLOOM-176B: LayerNorm replicas diverged
while the loss looked normal). Expected: ``replica_divergence``.
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
        backward(model, batch)
        if step >= TRIGGER and run.rank == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
        optimizer.step()


CASE = Case("fault_ddp_clip_one_rank", train, expect=("replica_divergence",), trigger=TRIGGER, within=10,
            world_size=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
