"""Healthy: modules warm-started as copies, then trained on their own. A seq2seq-style model's
decoder embedding starts as a ``copy.deepcopy`` of the encoder's, and a second task head is built
alike and loaded from the first head's ``state_dict``: each pair is bit-identical when training
starts, in separate tensors, and drifts apart as each learns its own job. That is the intent, not
a lost tie: no ``tie_broken`` (nor any other warning).
"""

import copy

import torch
from _harness import Case, Run, main, token_batches
from torch import nn

VOCAB, DIM = 50, 16


class TwoTower(nn.Module):
    """Encoder and decoder embeddings, and a head for each of two tasks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Embedding(VOCAB, DIM)
        self.decoder = copy.deepcopy(self.encoder)  # warm start: a copy, deliberately not tied
        self.head_next = nn.Linear(DIM, VOCAB)
        self.head_prev = nn.Linear(DIM, VOCAB)
        self.head_prev.load_state_dict(self.head_next.state_dict())

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        context = torch.tanh(self.encoder(tokens) + self.decoder(tokens.roll(1, dims=1)))
        return self.head_next(context), self.head_prev(context)


def train(run: Run) -> None:
    model = TwoTower()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.watch([optimizer], model, manual=True)
    for _, tokens in token_batches(40):
        optimizer.zero_grad()
        next_logits, prev_logits = model(tokens[:, 1:-1])
        loss = (nn.functional.cross_entropy(next_logits.reshape(-1, VOCAB), tokens[:, 2:].reshape(-1))
                + nn.functional.cross_entropy(prev_logits.reshape(-1, VOCAB), tokens[:, :-2].reshape(-1)))
        loss.backward()
        optimizer.step()
        run.step(loss)


CASE = Case("healthy_warm_start_copy", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
