"""Fingerprints of the batches a training loop consumes, taken on the data path.

The same batch coming twice is a silent data bug: DataLoader workers all seeded with the same
constant yield identical batches (PyTorch's "Randomness in multi-process data loading" notes),
and a shuffling loader whose generator is re-seeded every epoch replays the previous epoch. To
see it, each batch gets a fingerprint: a hash of a strided sample of at most
:data:`SAMPLE_ELEMENTS` values of its first CPU tensor (the inputs, as DataLoaders return them),
with its shape and dtype. A few microseconds per batch; a tensor already on an accelerator is not
read (that would wait for the device), so a batch moved there by the loader has no fingerprint.

:class:`LoaderPasses` numbers the passes (epochs) and the batches within each, for the
``Monitor.track_data`` path and for ``tuimon run``'s DataLoader hook, and says whether the
loader shuffles and how many workers it has: what :class:`~publisher.detectors.data.DuplicateBatches`
needs to tell a bug from a loader that repeats by design.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

#: Values of a batch's first tensor that go into its fingerprint.
SAMPLE_ELEMENTS = 256


@dataclass(frozen=True, slots=True)
class BatchPrint:
    """One batch as the duplicate check sees it."""

    loader: int  # which loader (stable for the loader's lifetime)
    epoch: int  # pass over the loader, from 0
    index: int  # batch within the pass, from 0
    digest: int  # the fingerprint
    shuffled: bool  # the loader draws its order at random
    workers: int  # the loader's worker processes


def fingerprint(batch: Any) -> int | None:
    """A hash of a strided sample of the batch's first CPU tensor, its shape and dtype; None when
    the batch holds no CPU tensor."""
    tensor = _first_tensor(batch)
    if tensor is None or tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    flat = tensor.detach().reshape(-1)
    stride = max(1, flat.numel() // SAMPLE_ELEMENTS)
    try:  # through numpy: a view and a slice, a few microseconds
        sample = flat.numpy()[::stride][:SAMPLE_ELEMENTS].tobytes()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks: the same bytes via torch
        sample = flat[::stride][:SAMPLE_ELEMENTS].contiguous().view(torch.uint8).numpy().tobytes()
    return hash((tuple(tensor.shape), str(tensor.dtype), sample))


def _first_tensor(batch: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor in a batch: itself, or the first in a tuple, list or dict (nested a little)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if depth > 3:
        return None
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else ()
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def loader_shuffles(source: Any) -> bool:
    """Whether a DataLoader, a batch sampler or a sampler draws its order at random: a
    RandomSampler, or a sampler that says ``shuffle`` (DistributedSampler), wherever it sits."""
    for _ in range(3):  # loader -> batch sampler -> sampler
        if isinstance(source, torch.utils.data.RandomSampler) or getattr(source, "shuffle", False) is True:
            return True
        inner = getattr(source, "sampler", None)
        if inner is None or inner is source:
            inner = getattr(source, "batch_sampler", None)
        if inner is None:
            return False
        source = inner
    return False


class LoaderPasses:
    """Numbers the passes over one loader and the batches within each pass."""

    def __init__(self, loader: Any, *, workers: int | None = None, shuffled: bool | None = None) -> None:
        self.loader_id = id(loader)
        self.workers = int(getattr(loader, "num_workers", 0) or 0) if workers is None else workers
        self.shuffled = loader_shuffles(loader) if shuffled is None else shuffled
        self.epoch = -1
        self.index = 0

    def new_pass(self) -> None:
        self.epoch += 1
        self.index = 0

    def print_of(self, batch: Any) -> BatchPrint | None:
        """The next batch's print (None when it has no CPU tensor to fingerprint)."""
        digest = fingerprint(batch)
        index = self.index
        self.index += 1
        if digest is None:
            return None
        return BatchPrint(self.loader_id, max(self.epoch, 0), index, digest, self.shuffled, self.workers)
