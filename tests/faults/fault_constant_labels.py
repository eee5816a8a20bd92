"""Fault: a 10-class MLP classifier whose labels were read from the wrong place: every label is 0.
The loss falls to ~0.01 within a few dozen steps, which looks like great training, and accuracy is
chance. Expected: ``single_class_labels`` once 1,400 labels are in, 22 batches of 64 (a class of
1 % would have shown by then with probability 1 - 1e-6): within 25 steps.
"""

import torch
from _harness import Case, Run, fit, labelled, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 64, 10), seed=5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    for _, (x, y) in labelled(40, batch=64, seed=5):
        fit(model, optimizer, (x, torch.zeros_like(y)))


CASE = Case("fault_constant_labels", train, expect=("single_class_labels",), trigger=0, within=25)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
