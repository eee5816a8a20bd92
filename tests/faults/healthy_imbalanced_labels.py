"""Healthy: a binary classifier on imbalanced data, 5 % positives, batches of 16 (0 to 6 positives
each, none in ~44 % of them), with ``cross_entropy`` over 2 classes. One-class batches are what
such data gives: no ``class_sorted_batches``, and the positives, rare as they are, come often
enough that ``single_class_labels`` stays quiet.
"""

import torch
from _harness import Case, Run, fit, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 32, 2), seed=14)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    run.watch([optimizer], model)
    g = torch.Generator().manual_seed(14)
    direction = torch.randn(16, generator=g)
    for _ in range(120):
        x = torch.randn(16, 16, generator=g)
        y = (torch.rand(16, generator=g) < 0.05).long()
        fit(model, optimizer, (x + 1.5 * y.unsqueeze(1) * direction, y))


CASE = Case("healthy_imbalanced_labels", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
