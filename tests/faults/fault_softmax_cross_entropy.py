"""Fault: an MLP classifier that ends in ``Softmax``, trained with ``F.cross_entropy``, which applies
``log_softmax`` itself. The probabilities are taken for logits: the loss falls from 2.3 to ~1.5 and
stops there, finite and smooth, with the gradients flowing. Expected: ``loss_input_mismatch`` within
3 steps (three looks at the loss call confirm it), naming the call and the input's shape.
"""

import torch
from _harness import Case, Run, fit, labelled, main, mlp
from torch import nn


def train(run: Run) -> None:
    model = nn.Sequential(mlp((16, 64, 10), seed=3), nn.Softmax(dim=1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    for _, batch in labelled(40, batch=64, seed=1):
        fit(model, optimizer, batch)


CASE = Case("fault_softmax_cross_entropy", train, expect=("loss_input_mismatch",), trigger=0, within=3)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
