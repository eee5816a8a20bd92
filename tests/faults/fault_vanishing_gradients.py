"""Fault: vanishing gradients. A 12-layer sigmoid network with a small initialisation (std 0.05):
each layer multiplies the backward signal by at most 0.25 x its small weights, so the first
layers get gradients millions of times smaller than the last one and do not learn, while the loss
still creeps down through the last layers. Expected: ``vanishing_gradient`` from the first samples.
"""

import torch
from _harness import Case, Run, batches, main, train_step
from torch import nn

DEPTH, WIDTH = 12, 32


def deep_sigmoid() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(8, WIDTH), nn.Sigmoid()]
    for _ in range(DEPTH - 2):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Sigmoid()]
    layers.append(nn.Linear(WIDTH, 1))
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=0.05)
    return nn.Sequential(*layers)


def train(run: Run) -> None:
    model = deep_sigmoid()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.watch([optimizer], model)
    for _, batch in batches(20):
        train_step(model, optimizer, batch)


CASE = Case("fault_vanishing_gradients", train, expect=("vanishing_gradient",), trigger=0, within=3)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
