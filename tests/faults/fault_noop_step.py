"""Fault: ``step()`` changes nothing from step 7 on (TrainCheck: a step that updates nothing).

An SGD subclass with a "pause updates" switch (meant for a learning-rate finder) that is turned on
at step 7 and never off again: ``step()`` is still called every iteration and returns at once.
Expected: ``optimizer_noop``.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 7


class PausableSGD(torch.optim.SGD):
    paused = False

    def step(self, closure=None):
        if self.paused:
            return None
        return super().step(closure)


def train(run: Run) -> None:
    model = mlp()
    optimizer = PausableSGD(model.parameters(), lr=0.05, momentum=0.9)
    run.watch([optimizer], model)
    for step, batch in batches(25):
        optimizer.paused = step >= TRIGGER
        train_step(model, optimizer, batch)


CASE = Case("fault_noop_step", train, expect=("optimizer_noop",), trigger=TRIGGER)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
