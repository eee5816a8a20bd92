"""Fault: a binary classifier that ends in ``Sigmoid``, trained with ``nn.BCEWithLogitsLoss``, which
applies the sigmoid itself: the loss floors at ~0.31 instead of going to 0. Expected:
``loss_input_mismatch`` within 3 steps (every value of the input in [0, 1], over 3 looks of 32).
"""

import torch
from _harness import Case, Run, fit, labelled, main, mlp
from torch import nn


def train(run: Run) -> None:
    model = nn.Sequential(mlp((16, 32, 1), seed=4), nn.Sigmoid())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    loss = nn.BCEWithLogitsLoss()
    for _, (x, y) in labelled(40, batch=32, classes=2, seed=4):
        fit(model, optimizer, (x, y.float().unsqueeze(1)), loss)


CASE = Case("fault_sigmoid_bce_with_logits", train, expect=("loss_input_mismatch",), trigger=0, within=3)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
