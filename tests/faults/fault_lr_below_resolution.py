"""Fault: a learning rate too small from the start. A CNN trained with ``SGD(lr=1e-9,
momentum=0.9)``, the value of a sweep pasted for ``1e-1``: every update, ``lr * g``, is ~1e-10
where the weights are ~0.1, below float32's resolution (``eps * |w|`` ~ 1e-8), so ``w + dw == w``
for nearly every weight. The rate never falls from a peak (it has none to fall from), the loss is
finite and flat, the gradients flow. Expected: ``lr_vanished`` (cause ``below_resolution``) once
three per-layer samples spanning 10 steps have seen the weights not move.
"""

import torch
from _harness import Case, Run, cnn, fit, images, main
from torch import nn
from torch.utils.data import DataLoader


def train(run: Run) -> None:
    model = cnn(seed=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9, momentum=0.9)  # meant: 1e-1
    run.watch([optimizer], model)
    loss = nn.CrossEntropyLoss()
    for batch in run.track_data(DataLoader(images(2560, seed=4), batch_size=32, shuffle=True)):
        fit(model, optimizer, batch, loss)


CASE = Case("fault_lr_below_resolution", train, expect=("lr_vanished",), trigger=0, within=40)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
