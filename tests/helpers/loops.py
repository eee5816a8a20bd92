"""Small real training loops built from ingredients, for the generative test of whole loops.

A :class:`LoopRecipe` says what a loop is made of: the model (an MLP, a convolution in channels-last
memory, a hand-written attention, a block under gradient checkpointing, complex weights, an
embedding with sparse gradients), its dtype, the loss (a
masked one can select no row and be NaN), what the loop hands the Monitor as the loss (a tensor, a
Python float, a NumPy scalar, a tensor without a graph), the batch's container (a tuple, a dict, a
namedtuple, one holding strings and None), gradient accumulation (several ``backward`` calls a
step), iterations that take no optimizer step, ``torch.no_grad`` evaluations inside the loop, the
caller's extras of odd dtypes, and the iterations whose loss is made NaN. :func:`train` runs one,
under an embedded Monitor or bare (``tuimon run`` then watches it:
``tests/scripts/plain_recipe_loop.py``), and says what each optimizer step's loss was.
"""

from __future__ import annotations

import json
import math
from collections import namedtuple
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

MODELS = ("mlp", "conv", "attention", "checkpointed", "complex", "sparse_embedding")
DTYPES = ("float32", "float64", "bfloat16")
LOSSES = ("cross_entropy", "masked", "mse", "nll")
LOSS_AS = ("tensor", "float", "numpy", "detached", "one_element")
BATCHES = ("tuple", "dict", "namedtuple", "with_strings")
EXTRAS = ("int_tensor", "bool_tensor", "half_tensor", "numpy", "python_int")
CLASSES, FEATURES = 4, 8
Batch = namedtuple("Batch", ["x", "y"])


@dataclass(frozen=True)
class LoopRecipe:
    """One loop's ingredients (see the module's docstring); ``nan_at``: iterations (1-based) whose
    loss is made NaN; ``skip_every``/``evaluate_every``: 0 for never, else every that many
    iterations."""

    model: str = "mlp"
    dtype: str = "float32"
    loss: str = "cross_entropy"
    loss_as: str = "tensor"
    batch: str = "tuple"
    backwards: int = 1
    skip_every: int = 0
    evaluate_every: int = 0
    nan_at: tuple[int, ...] = ()
    extras: tuple[str, ...] = ()
    iterations: int = 40
    batch_size: int = 8
    #: Batches from a real DataLoader (``Monitor.track_data`` when embedded), collated from the
    #: container ``batch`` names; else made in the loop.
    loader: bool = False
    #: Inputs handed to the model as a non-contiguous view (a transpose of a transpose's slice).
    strided: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LoopRecipe:
        fields = json.loads(text)
        return cls(**{**fields, "nan_at": tuple(fields["nan_at"]), "extras": tuple(fields["extras"])})


class _Attention(nn.Module):
    """A hand-written single-head attention over the features split into tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(2, 6)
        self.out = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.view(x.shape[0], FEATURES // 2, 2)
        q, k, v = self.qkv(tokens).split(2, dim=-1)
        weights = (q @ k.transpose(1, 2) / math.sqrt(2)).softmax(-1)
        return self.out((weights @ v).reshape(x.shape[0], FEATURES))


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.head = nn.Linear(4 * 2 * 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = x.view(x.shape[0], 2, 2, 2).contiguous(memory_format=torch.channels_last)
        return self.head(F.relu(self.conv(image)).flatten(1))


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, x, use_reentrant=False))


class _Complex(nn.Module):
    """A layer with complex weights (a spectral filter's kind), read out as magnitudes."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(FEATURES, CLASSES, dtype=torch.complex64) / FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.complex64) @ self.weight).abs().to(x.dtype)


class _SparseEmbedding(nn.Module):
    """Features bucketed into tokens looked up in an embedding with sparse gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(16, CLASSES, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = (x.float().clamp(-1.99, 1.99) * 4 + 8).long()
        return self.embedding(tokens).mean(1).to(x.dtype)


def _model(recipe: LoopRecipe) -> nn.Module:
    if recipe.model == "complex":
        return _Complex()
    if recipe.model == "sparse_embedding":
        return _SparseEmbedding()
    if recipe.model == "conv":
        return _Conv()
    if recipe.model == "attention":
        return _Attention()
    if recipe.model == "checkpointed":
        return _Checkpointed()
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def _batch(recipe: LoopRecipe, x: torch.Tensor, y: torch.Tensor) -> Any:
    if recipe.batch == "dict":
        return {"x": x, "y": y, "ids": list(range(y.numel()))}
    if recipe.batch == "namedtuple":
        return Batch(x, y)
    if recipe.batch == "with_strings":
        return (x, y, ["text"] * len(y), None)
    return (x, y)


def _unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, dict):
        return batch["x"], batch["y"]
    return batch[0], batch[1]


def _loss(recipe: LoopRecipe, logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if recipe.loss == "masked":  # over the labelled rows only: NaN where none is
        return F.cross_entropy(logits[mask], y[mask])
    if recipe.loss == "mse":
        return F.mse_loss(logits, F.one_hot(y, CLASSES).to(logits.dtype))
    if recipe.loss == "nll":
        return F.nll_loss(F.log_softmax(logits, -1), y)
    return F.cross_entropy(logits, y)


def _extras(recipe: LoopRecipe, step: int) -> dict[str, Any]:
    values = {"int_tensor": torch.tensor(step), "bool_tensor": torch.tensor(step % 2 == 0),
              "half_tensor": torch.tensor(0.5, dtype=torch.float16), "numpy": np.float32(0.25),
              "python_int": step}
    return {name: values[name] for name in recipe.extras}


def _handed(recipe: LoopRecipe, loss: torch.Tensor) -> Any:
    """The loss as the loop hands it to the Monitor."""
    if recipe.loss_as == "float":
        return float(loss)
    if recipe.loss_as == "numpy":
        return np.float64(float(loss))
    if recipe.loss_as == "detached":
        return loss.detach()
    if recipe.loss_as == "one_element":
        return loss.reshape(1)
    return loss


def _collate(items: list[Any]) -> Any:
    """A DataLoader's collation of ``_batch`` containers (strings and None kept as lists)."""
    first = items[0]
    if isinstance(first, dict):
        return {key: _collate([item[key] for item in items]) for key in first}
    if isinstance(first, tuple):
        columns = [_collate(list(column)) for column in zip(*items, strict=True)]
        return type(first)(*columns) if hasattr(first, "_fields") else tuple(columns)
    if isinstance(first, torch.Tensor):
        return torch.cat(items)
    if isinstance(first, list):
        return [value for item in items for value in item]
    return items


def _batches(recipe: LoopRecipe, dtype: torch.dtype, generator: torch.Generator,
             weights: torch.Tensor) -> Any:
    """The loop's batches: made one by one, or from a real DataLoader over the same rows."""
    x = torch.randn(recipe.iterations * recipe.batch_size, FEATURES, generator=generator)
    y = (x @ weights).argmax(1)  # learnable
    if recipe.loader:  # one row an example, in the batch's container, collated by the loader
        rows = [_batch(recipe, x[i:i + 1].to(dtype), y[i:i + 1]) for i in range(len(y))]
        return torch.utils.data.DataLoader(rows, batch_size=recipe.batch_size, collate_fn=_collate)
    return [_batch(recipe, x[i:i + recipe.batch_size].to(dtype), y[i:i + recipe.batch_size])
            for i in range(0, len(y), recipe.batch_size)]


Watch = Callable[[nn.Module, torch.optim.Optimizer], Any]


def train(recipe: LoopRecipe, watch: Watch | None = None) -> list[float]:
    """Run the loop (``watch``: makes the embedded Monitor of the model and its optimizer, stepped
    after each optimizer step; None for a bare loop); each optimizer step's loss (the mean of its
    backward calls' losses) in order."""
    torch.manual_seed(0)
    dtype = getattr(torch, recipe.dtype)
    model = _model(recipe)
    if recipe.model != "complex":  # its weights stay complex
        model = model.to(dtype)
    optimizer = (torch.optim.SGD(model.parameters(), lr=1e-2) if recipe.model == "sparse_embedding"
                 else torch.optim.AdamW(model.parameters(), lr=1e-2))
    monitor = watch(model, optimizer) if watch is not None else None
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(FEATURES, CLASSES, generator=generator)
    batches = _batches(recipe, dtype, generator, weights)
    if monitor is not None and recipe.loader:
        batches = monitor.track_data(batches)
    step_losses: list[float] = []
    pending: list[torch.Tensor] = []
    for iteration, batch in enumerate(batches, 1):
        x_used, y_used = _unpack(batch)
        if recipe.strided:
            x_used = x_used.t().contiguous().t()[:, : FEATURES]  # column-major: not contiguous
        mask = torch.rand(len(y_used), generator=generator) < 0.5
        loss = _loss(recipe, model(x_used), y_used, mask)
        if iteration in recipe.nan_at:
            loss = loss * math.nan
        (loss / recipe.backwards).backward()
        pending.append(loss.detach().float())
        if recipe.evaluate_every and iteration % recipe.evaluate_every == 0:
            with torch.no_grad():
                model(x_used)
        if len(pending) < recipe.backwards or (recipe.skip_every and iteration % recipe.skip_every == 0):
            continue  # accumulating, or an iteration that takes no optimizer step
        optimizer.step()
        optimizer.zero_grad()
        step_loss = torch.stack(pending).mean()
        pending = []
        step_losses.append(float(step_loss))
        if monitor is not None:
            monitor.step(_handed(recipe, step_loss), **_extras(recipe, len(step_losses)))
    return step_losses
