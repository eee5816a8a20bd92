"""Healthy: a small transformer classifier that ends in ``LogSoftmax``, trained with
``nn.NLLLoss``: log-probabilities where log-probabilities are taken. No ``loss_input_mismatch``;
its four classes come mixed in every batch, so neither label check speaks.
"""

import torch
from _harness import Case, Run, TinyTransformer, fit, main, token_labels
from torch import nn


def train(run: Run) -> None:
    model = nn.Sequential(TinyTransformer(seed=13), nn.LogSoftmax(dim=1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    run.watch([optimizer], model)
    loss = nn.NLLLoss()
    for _, batch in token_labels(60, batch=32, seed=13):
        fit(model, optimizer, batch, loss)


CASE = Case("healthy_log_softmax_nll", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
