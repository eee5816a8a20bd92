"""Fault: ``model.eval()`` for a validation pass at step 7, and no ``model.train()`` afterwards.

The model has Dropout and BatchNorm: from step 7 it trains with dropout off and frozen batch
statistics. Expected: ``eval_mode_training``.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 7


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1), dropout=0.2, batch_norm=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for step, batch in batches(25):
        if step == TRIGGER:
            model.eval()
            with torch.no_grad():
                model(batch[0])
        train_step(model, optimizer, batch)


CASE = Case("fault_eval_left_on", train, expect=("eval_mode_training",), trigger=TRIGGER)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
