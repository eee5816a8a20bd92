"""Healthy: a shuffled training loader and an unshuffled validation loader, both iterated through
the Monitor's data timing, validation after every epoch. The validation batches come back
identical every epoch (that is what an unshuffled validation set does) and nothing follows them
but evaluation: no ``duplicate_batches`` (nor any other warning).
"""

import torch
from _harness import Case, Run, backward, main, mlp, regression_set
from torch import nn
from torch.utils.data import DataLoader

BATCH = 16
EPOCHS = 5


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1), dropout=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model, manual=True)
    training = DataLoader(regression_set(20 * BATCH, seed=1), batch_size=BATCH, shuffle=True)
    validation = DataLoader(regression_set(4 * BATCH, seed=2), batch_size=BATCH)
    for _ in range(EPOCHS):
        model.train()
        for batch in run.track_data(training):
            optimizer.zero_grad()
            loss = backward(model, batch)
            optimizer.step()
            run.step(loss, samples=BATCH)
        model.eval()
        with torch.no_grad():
            for x, y in run.track_data(validation):
                nn.functional.mse_loss(model(x), y)


CASE = Case("healthy_validation_loader", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
