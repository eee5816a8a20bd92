"""Healthy: adversarial training (FGSM) on a small CNN. Each step the batch's images are made
leaves that require grad (``x.requires_grad_(True)``), the loss's gradient with respect to them
perturbs them, and the model trains on the perturbed batch. The inputs receive gradients and no
optimizer steps them, by design, and they are new tensors every step: no ``unowned_parameters``
(nor any other warning). A frozen stem (``requires_grad=False``) is in no optimizer either, rightly.
"""

import torch
from _harness import Case, Run, main
from torch import nn
from torch.nn import functional

EPSILON = 0.05


def images(steps: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    patterns = torch.randn(4, 1, 12, 12, generator=g)
    out = []
    for _ in range(steps):
        y = torch.randint(0, 4, (batch,), generator=g)
        out.append((patterns[y] + 0.5 * torch.randn(batch, 1, 12, 12, generator=g), y))
    return out


def train(run: Run) -> None:
    torch.manual_seed(0)
    stem = nn.Conv2d(1, 8, 3, padding=1)
    stem.requires_grad_(False)  # a frozen, pretrained stem
    head = nn.Sequential(nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 12 * 12, 4))
    model = nn.Sequential(stem, head)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.02, momentum=0.9)
    run.watch([optimizer], model, manual=True)
    for x, y in images(40):
        x = x.clone().requires_grad_(True)
        grad_x, = torch.autograd.grad(functional.cross_entropy(model(x), y), x)
        adversarial = (x + EPSILON * grad_x.sign()).detach()
        optimizer.zero_grad()
        loss = functional.cross_entropy(model(adversarial), y)
        loss.backward()
        optimizer.step()
        run.step(loss)


CASE = Case("healthy_adversarial_inputs", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
