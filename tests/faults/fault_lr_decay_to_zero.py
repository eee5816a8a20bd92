"""Fault: the learning rate decays to exactly 0 at step 10 while training runs on to step 30.

A linear decay schedule built for 10 steps (total steps mis-set) on a 30-step run: from step 10
on every step is a no-op. Expected: ``optimizer_noop`` (lr reached 0 at step 10).
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 10


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / TRIGGER))
    run.watch([optimizer], model)
    for _, batch in batches(30):
        train_step(model, optimizer, batch)
        schedule.step()


CASE = Case("fault_lr_decay_to_zero", train, expect=("optimizer_noop",), trigger=TRIGGER)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
