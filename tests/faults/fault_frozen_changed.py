"""Fault: the backbone is frozen at step 8, but momentum keeps moving it.

Gradients are cleared with ``zero_grad(set_to_none=False)``, so after ``requires_grad_(False)``
the frozen parameters keep a zero gradient tensor and SGD's momentum buffer keeps updating them
(TrainCheck: frozen stages updated anyway). Expected: ``frozen_param_changed``.
"""

import torch
from _harness import Case, Run, backward, batches, main, mlp
from torch import nn

TRIGGER = 8


def train(run: Run) -> None:
    model = nn.Sequential()
    model.add_module("backbone", mlp((8, 32, 16)))
    model.add_module("head", nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run.watch([optimizer], model)
    for step, batch in batches(25):
        if step == TRIGGER:
            model.backbone.requires_grad_(False)
        optimizer.zero_grad(set_to_none=False)
        backward(model, batch)
        optimizer.step()


CASE = Case("fault_frozen_changed", train, expect=("frozen_param_changed",), trigger=TRIGGER)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
