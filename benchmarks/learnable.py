"""Batches a model can learn, so that the cost benchmarks time the watching of a healthy run.

With labels drawn at random, the loss sits at chance level (log C for C classes) and a Monitor says
so, as it should (``chance_loss``, ``loss_plateau``): a benchmark on such batches times a Monitor
with episodes open and events going out, not what watching a healthy run costs. Here each label
is the class that a fixed random linear teacher gives its input (the argmax of ``x @ W``, a
separable task: Rosenblatt's perceptron setting), which the benchmarks' MLPs learn within a few
hundred steps.
"""

from __future__ import annotations

import torch


def learnable_batches(count: int, batch: int, d_in: int, classes: int,
                      device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of ``batch`` inputs of ``d_in`` features and their class labels (0 to
    ``classes`` - 1), from the global RNG (seed it first for the same batches in every arm)."""
    teacher = torch.randn(d_in, classes, device=device)
    batches = []
    for _ in range(count):
        inputs = torch.randn(batch, d_in, device=device)
        batches.append((inputs, (inputs @ teacher).argmax(dim=1)))
    return batches
