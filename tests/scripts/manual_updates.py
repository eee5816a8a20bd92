"""Backward passes with hand-written SGD updates and no torch.optim optimizer; no tuimon code.

Prints how many losses tuimon's zero-code hooks hold at the end (they must stay bounded).
"""

import torch

from publisher.autohook import hooks as autohook

weight = torch.zeros(4, requires_grad=True)
for _ in range(3000):
    loss = (weight - 1).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        weight -= 0.01 * weight.grad
        weight.grad = None
print(len(autohook._session.losses))
