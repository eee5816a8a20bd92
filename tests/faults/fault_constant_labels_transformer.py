"""Fault: a small transformer that classifies token sequences into 4 classes, every label of the
stream the same (the label column read from a constant): the loss falls towards 0 and nothing is
learned. Expected: ``single_class_labels`` once 1,400 labels are in (44 batches of 32): within 48
steps.
"""

import torch
from _harness import Case, Run, TinyTransformer, fit, main, token_labels
from torch import nn


def train(run: Run) -> None:
    model = TinyTransformer(seed=6)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    run.watch([optimizer], model)
    loss = nn.CrossEntropyLoss()
    for _, (tokens, y) in token_labels(50, batch=32, seed=6):
        fit(model, optimizer, (tokens, torch.full_like(y, 2)), loss)


CASE = Case("fault_constant_labels_transformer", train, expect=("single_class_labels",), trigger=0, within=48)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
