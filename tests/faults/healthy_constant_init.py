"""Healthy: layers of the same shape initialised to the same constants, then trained. A tiny
transformer-style language model with learned positions initialised to zeros, residual blocks
whose output projections start at zero (zero-init residuals, as in Fixup), layer norms at ones and
zeros, and an auxiliary previous-token head started at zero: the same values in separate tensors
at the start (an embedding and a head of the same 50x16 shape among them), which training moves
apart. Equal constants are an init scheme, not a tie: no ``tie_broken`` (nor any other warning).
"""

import torch
from _harness import Case, Run, main, token_batches
from torch import nn

VOCAB, DIM = 50, 16


class Block(nn.Module):
    """A residual MLP block whose output projection starts at zero: the block starts as identity."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.out(torch.relu(self.up(self.norm(h))))


class ZeroInitLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = nn.Embedding(VOCAB, DIM)  # up to 50 positions, learned from zeros
        nn.init.zeros_(self.positions.weight)
        self.blocks = nn.Sequential(Block(), Block())
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.previous = nn.Linear(DIM, VOCAB, bias=False)  # auxiliary task, learned from zeros
        nn.init.zeros_(self.previous.weight)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norm(self.blocks(self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))))
        return self.head(h), self.previous(h)


def train(run: Run) -> None:
    model = ZeroInitLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.watch([optimizer], model, manual=True)
    for _, tokens in token_batches(40):
        optimizer.zero_grad()
        following, previous = model(tokens[:, 1:-1])
        loss = (nn.functional.cross_entropy(following.reshape(-1, VOCAB), tokens[:, 2:].reshape(-1))
                + 0.5 * nn.functional.cross_entropy(previous.reshape(-1, VOCAB), tokens[:, :-2].reshape(-1)))
        loss.backward()
        optimizer.step()
        run.step(loss)


CASE = Case("healthy_constant_init", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
