"""Healthy: a tiny language model whose output projection shares the embedding matrix."""

import torch
from _harness import Case, Run, main
from torch import nn

VOCAB, DIM = 50, 16


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens))))


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    g = torch.Generator().manual_seed(4)
    for _ in range(30):
        tokens = torch.randint(0, VOCAB, (8, 12), generator=g)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


CASE = Case("healthy_tied_weights", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
