"""Fault: a CNN trained on images stored sorted by class through a DataLoader with
``shuffle=False``: every batch holds one class, block after block, and the model learns the block it
is in. The loss swings with each block; no loss or gradient detector names the cause. Expected:
``class_sorted_batches`` a few batches after the first block ends (each class is 64 images, 4
batches of 16): within 12 steps.
"""

import torch
from _harness import Case, Run, cnn, fit, images, main, sorted_by_class
from torch.utils.data import DataLoader


def train(run: Run) -> None:
    model = cnn(seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run.watch([optimizer], model)
    data = sorted_by_class(images(640, seed=7))
    for batch in run.track_data(DataLoader(data, batch_size=16, shuffle=False)):
        fit(model, optimizer, batch)


CASE = Case("fault_class_sorted_batches", train, expect=("class_sorted_batches",), trigger=0, within=12)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
