"""Fault: ``optimizer.zero_grad()`` dropped from the loop at step 6 (TrainCheck: missing zero_grad).

From the trigger on, every backward adds onto the previous steps' gradients; the loss may even
keep falling for a while. Expected: ``stale_gradients``.
"""

import torch
from _harness import Case, Run, backward, batches, main, mlp

TRIGGER = 6


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    run.watch([optimizer], model)
    for step, batch in batches(25):
        if step < TRIGGER:
            optimizer.zero_grad()
        backward(model, batch)
        optimizer.step()


CASE = Case("fault_missing_zero_grad", train, expect=("stale_gradients",), trigger=TRIGGER)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
