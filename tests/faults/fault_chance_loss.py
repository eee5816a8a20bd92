"""Fault: a 10-class classifier whose labels were shuffled apart from its inputs (features and
labels permuted by two different shuffles). The loss is finite and smooth and the gradients flow,
but there is nothing to learn: ``F.cross_entropy`` sits at chance, log(10) = 2.30, from the first
steps, and the logits' shape says there are 10 classes. Expected: ``chance_loss`` within 80 steps of
the start (``loss_plateau`` alone takes ~140). Not within a few: a slow learner
(``healthy_slow_learner``) sits as close to chance for its first fifty steps, and only the trend
over a window of steps tells the two apart.
"""

import torch
from _harness import Case, Run, labelled, main, mlp
from torch.nn import functional


def train(run: Run) -> None:
    model = mlp((16, 64, 10), seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run.watch([optimizer], model, manual=True)
    for _, (x, y) in labelled(100, batch=64, seed=1, shuffle_labels=True):
        optimizer.zero_grad()
        loss = functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        run.step(loss)


CASE = Case("fault_chance_loss", train, expect=("chance_loss",), trigger=0, within=80)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
