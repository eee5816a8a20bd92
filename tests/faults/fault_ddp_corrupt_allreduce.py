"""Fault (2 gloo processes): the gradient all-reduce is corrupted on rank 1 from step 6.

A DDP communication hook stands in for a faulty link (a broken GPU peer-to-peer path): on rank 1
the averaged bucket comes back scaled by 1.001. Expected: ``replica_divergence``.
"""

import torch
from _harness import Case, Run, backward, batches, ddp, main, mlp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

TRIGGER = 6


def corrupting_allreduce(state: dict, bucket):
    averaged = allreduce_hook(None, bucket)
    if not state["corrupt"]:
        return averaged
    return averaged.then(lambda future: future.value() * 1.001)


def train(run: Run) -> None:
    model = ddp(mlp())
    state = {"corrupt": False}
    model.register_comm_hook(state, corrupting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for step, batch in batches(25, seed=run.rank):
        state["corrupt"] = step >= TRIGGER and run.rank == 1
        optimizer.zero_grad()
        backward(model, batch)
        optimizer.step()


CASE = Case("fault_ddp_corrupt_allreduce", train, expect=("replica_divergence",), trigger=TRIGGER,
            within=10, world_size=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
