"""Fault: a backward that overflows while the forward is finite.

``RowScale`` divides each row by its length, computed as ``sqrt(sum(x**2))`` plus a small
epsilon: the forward of an all-zero row is 0 / eps = 0, finite, but the derivative of the square
root at 0 is infinite (inf * 0 = NaN in the chain rule). At the trigger the batch holds an
all-zero sample (padding), so the loss stays finite and the gradients do not. Expected:
``nonfinite_origin`` naming ``Net.scale`` (RowScale), phase backward, reproduced.
"""

import torch
from _harness import Case, Run, batches, main
from torch import nn

TRIGGER = 20


class RowScale(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h / (torch.sqrt((h * h).sum(-1, keepdim=True)) + 1e-6)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16, bias=False)  # a zero row stays zero
        self.scale = RowScale()
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale(self.embed(x)))


def train(run: Run, policy: str = "report") -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, on_nonfinite=policy)
    for step, (x, y) in run.track_data(batches(30)):
        if step == TRIGGER:
            x = x.clone()
            x[0] = 0.0
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        run.note_loss(loss.detach())
        optimizer.step()


CASE = Case("fault_nonfinite_backward", train, expect=("nonfinite_origin",), trigger=TRIGGER, within=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
