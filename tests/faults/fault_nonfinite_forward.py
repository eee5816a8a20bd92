"""Fault: a hand-written attention divides 0/0 for a rare batch whose sequences have length 1.

Every other batch trains normally; at the trigger the batch's sequences are one token long, the
attention's mask leaves nothing to attend to, and its normalisation is 0/0: NaN in the forward,
then in every gradient from ``embed`` to ``head``. Expected: ``nonfinite_origin`` naming
``Net.attn`` (NeighbourAttention), phase forward, reproduced, on the step itself; the loss's own
``nonfinite_loss`` with it.
"""

import torch
from _harness import Case, Run, main
from torch import nn

TRIGGER = 20


class NeighbourAttention(nn.Module):
    """Each position attends to the other positions of its sequence (never to itself)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        length = h.shape[1]
        scores = self.score(h) @ h.transpose(1, 2)
        others = 1.0 - torch.eye(length)  # nothing to attend to when length == 1
        weights = torch.exp(scores - scores.amax(-1, keepdim=True)) * others
        return (weights / weights.sum(-1, keepdim=True)) @ h  # 0/0 for a length-1 sequence


class Net(nn.Module):
    def __init__(self, vocab: int = 20, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = NeighbourAttention(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(self.embed(tokens))).mean(1)


def sequences(steps: int, trigger: int = TRIGGER) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token batches of length 6, one of length 1 at ``trigger``; targets from the first token."""
    g = torch.Generator().manual_seed(7)
    out = []
    for step in range(steps):
        tokens = torch.randint(0, 20, (8, 1 if step == trigger else 6), generator=g)
        out.append((tokens, (tokens[:, :1].float() / 20.0)))
    return out


def train(run: Run, policy: str = "report") -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, on_nonfinite=policy)
    for tokens, target in run.track_data(sequences(30)):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(tokens), target)
        loss.backward()
        run.note_loss(loss.detach())
        optimizer.step()


CASE = Case("fault_nonfinite_forward", train, expect=("nonfinite_origin", "nonfinite_loss"), trigger=TRIGGER,
            within=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
