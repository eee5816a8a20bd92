"""Healthy: a 10-class classifier trained on batches of 2 to 4 examples (a memory-bound setting):
one-class batches are common (a tenth of the batches of 2) and say nothing about the order of the
stream: no ``class_sorted_batches``, no ``single_class_labels``.
"""

import torch
from _harness import Case, Run, fit, labelled, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 64, 10), seed=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    run.watch([optimizer], model)
    for step, batch in labelled(100, batch=4, seed=16):
        size = 2 + step % 3
        fit(model, optimizer, (batch[0][:size], batch[1][:size]))


CASE = Case("healthy_tiny_classifier_batches", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
