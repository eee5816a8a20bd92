"""Healthy: a data set smaller than one batch (20 samples, batches of 32), as when fitting a handful
of labelled examples: every epoch is one batch holding the whole data set, the same samples each
time, reshuffled (first half of the run) or in the same order, byte for byte (second half). That is
the data set, not a pipeline replaying itself: no ``duplicate_batches`` (nor any other warning).
"""

import torch
from _harness import Case, Run, backward, main, mlp, regression_set
from torch.utils.data import DataLoader

EPOCHS = 30


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, manual=True)
    tiny = regression_set(20)
    for shuffle in (True, False):
        loader = DataLoader(tiny, batch_size=32, shuffle=shuffle)
        for _ in range(EPOCHS):
            for batch in run.track_data(loader):
                optimizer.zero_grad()
                loss = backward(model, batch)
                optimizer.step()
                run.step(loss, samples=len(batch[0]))


CASE = Case("healthy_tiny_dataset", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
