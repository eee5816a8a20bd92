"""Healthy: a sparse embedding (``nn.Embedding(sparse=True)``) trained with SparseAdam next to a
dense Adam; each batch touches a few of the 1000 rows, most rows get no gradient in a batch."""

import torch
from _harness import Case, Run, main
from torch import nn

ROWS = 1000


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(ROWS, 8, sparse=True)
        self.score = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.score(self.items(ids).mean(dim=1))


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = Recommender()
    sparse = torch.optim.SparseAdam(list(model.items.parameters()), lr=1e-2)
    dense = torch.optim.Adam(model.score.parameters(), lr=1e-3)
    run.watch([sparse, dense], model)
    g = torch.Generator().manual_seed(5)
    for _ in range(30):
        ids = torch.randint(0, ROWS, (16, 3), generator=g)
        target = (ids.float().mean(dim=1, keepdim=True) / ROWS)
        sparse.zero_grad()
        dense.zero_grad()
        nn.functional.mse_loss(model(ids), target).backward()
        sparse.step()
        dense.step()


CASE = Case("healthy_sparse_embeddings", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
