"""Healthy: a time series read in order (a DataLoader with ``shuffle=False``, as forecasting code
does), each window labelled by where the series goes next: down, flat or up. The stream is
unshuffled, but every batch mixes the three classes: no ``class_sorted_batches``.
"""

import torch
from _harness import Case, Run, fit, main, mlp
from torch.utils.data import DataLoader, TensorDataset

WINDOW = 12


def series_windows(length: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length + WINDOW + 1, dtype=torch.float32)
    series = torch.sin(t / 3.0) + 0.3 * torch.randn(len(t), generator=g)
    windows = series.unfold(0, WINDOW, 1)[:length]
    change = series[WINDOW:WINDOW + length] - series[WINDOW - 1:WINDOW - 1 + length]
    labels = torch.bucketize(change, torch.tensor([-0.2, 0.2]))
    return TensorDataset(windows, labels)


def train(run: Run) -> None:
    model = mlp((WINDOW, 32, 3), seed=15)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    run.watch([optimizer], model)
    for _ in range(2):
        for batch in run.track_data(DataLoader(series_windows(1024, seed=15), batch_size=32, shuffle=False)):
            fit(model, optimizer, batch)


CASE = Case("healthy_unshuffled_series", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
