"""Fault: the model is rebuilt from a checkpoint at step 8, the old optimizer is kept.

``model = build(); model.load_state_dict(state)`` mid-run, with the optimizer still holding the
old model's parameters: from then on the optimizer steps tensors no backward reaches, and the new
model never changes. Expected: ``optimizer_noop``.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 8


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for step, batch in batches(25):
        if step == TRIGGER:
            state = model.state_dict()
            model = mlp()
            model.load_state_dict(state)
        train_step(model, optimizer, batch)


CASE = Case("fault_wrong_tensors", train, expect=("optimizer_noop",), trigger=TRIGGER)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
