"""Fault: intermittent NaN loss. From step 31 on, one record in a few batches holds a NaN (a corrupt
row in a data shard); the loop skips the update when the loss is not finite, as guarded trainers
do, so the run "keeps going" and only the logged loss says anything. Expected: ``nonfinite_loss``
(critical) at the first bad step; the later bad steps, close together, fold into that episode.
"""

import torch
from _harness import Case, Run, backward, batches, main, mlp

TRIGGER = 30
BAD = {TRIGGER, TRIGGER + 1, TRIGGER + 7}


def train(run: Run) -> None:
    model = mlp((8, 32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, manual=True)
    for step, (x, y) in batches(50):
        if step in BAD:
            x = x.clone()
            x[3, 0] = float("nan")
        optimizer.zero_grad()
        loss = backward(model, (x, y))
        if torch.isfinite(loss):
            optimizer.step()
        run.step(loss)


CASE = Case("fault_nan_loss", train, expect=("nonfinite_loss",), trigger=TRIGGER, within=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
