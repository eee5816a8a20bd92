"""Fault: a scheduler meant to step once an epoch, stepped every batch. ``StepLR(step_size=1,
gamma=0.9)`` ("lr x0.9 each epoch") with ``scheduler.step()`` inside the batch loop of a 10-class
MLP classifier: the rate falls from 0.1 to 1e-5 (1e-4 of its peak) by step 88 and to 1e-14 by step
300. The loss falls for a few dozen steps and then sits still, finite and smooth, while gradients
flow: every update is below the float resolution of the weights. Expected: ``lr_vanished`` once the
rate has stayed below 1e-4 of its peak for 50 steps (~step 138). No other check speaks today.
"""

import torch
from _harness import Case, Run, labelled, main, mlp
from torch.nn import functional


def train(run: Run) -> None:
    model = mlp((16, 64, 10), seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)  # meant per epoch
    run.watch([optimizer], model, manual=True)
    for _, (x, y) in labelled(220, batch=64, seed=1):
        optimizer.zero_grad()
        loss = functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        schedule.step()  # the bug: in the batch loop
        run.step(loss)


CASE = Case("fault_lr_stepped_per_batch", train, expect=("lr_vanished",), trigger=0, within=150)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
