"""Healthy: a CNN trained with mixup: each batch is blended with a shuffled copy of itself and
``nn.CrossEntropyLoss`` gets the blended one-hot labels, *probabilities as targets*; every third
step the targets are a teacher-free temperature-softened copy of the one-hot labels. Probabilities
are right there: no ``loss_input_mismatch``, and no label check reads probability targets.
"""

import torch
from _harness import Case, Run, cnn, fit, images, main
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader


def train(run: Run) -> None:
    model = cnn(seed=12)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    run.watch([optimizer], model)
    loss = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(12)
    for i, (x, y) in enumerate(run.track_data(DataLoader(images(960, seed=12), batch_size=16, shuffle=True))):
        one_hot = functional.one_hot(y, 10).float()
        if i % 3 == 2:
            targets = functional.softmax(one_hot * 4.0, dim=1)
        else:
            mix = float(torch.rand((), generator=g)) * 0.4
            order = torch.randperm(len(y), generator=g)
            x, targets = (1 - mix) * x + mix * x[order], (1 - mix) * one_hot + mix * one_hot[order]
        fit(model, optimizer, (x, targets), loss)


CASE = Case("healthy_soft_label_targets", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
