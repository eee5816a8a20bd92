"""Fingerprints of the batches a training loop consumes, taken on the data path.

The same batch coming twice is a silent data bug: DataLoader workers all seeded with the same
constant yield identical batches (PyTorch's "Randomness in multi-process data loading" notes),
and a shuffling loader whose generator is re-seeded every epoch replays the previous epoch. To
see it, batches get a fingerprint: a hash of a strided sample of at most
:data:`SAMPLE_ELEMENTS` values of its first CPU tensor (the inputs, as DataLoaders return them),
with its shape and dtype: the first batches of each pass and then runs of consecutive ones
(:data:`FIRST_PRINTED`, :data:`PRINT_RUN`). A tensor already on an accelerator is not read (that
would wait for the device), so a batch moved there by the loader has no fingerprint.

:class:`LoaderPasses` numbers the passes (epochs) and the batches within each, for the
``Monitor.track_data`` path and for ``tuimon run``'s DataLoader hook, and says whether the
loader shuffles and how many workers it has: what :class:`~publisher.detectors.data.DuplicateBatches`
needs to tell a bug from a loader that repeats by design.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

#: Values of a batch's first tensor that go into its fingerprint.
SAMPLE_ELEMENTS = 256
#: Batches fingerprinted in each pass: the first ``FIRST_PRINTED`` (a replayed epoch shows in
#: its first batches; workers seeded alike repeat within their first round), then runs of
#: ``PRINT_RUN`` consecutive batches every ``PRINT_PERIOD`` (workers seeded alike repeat within
#: any run longer than their number): a sixteenth of the batches of a long pass. A fingerprint
#: costs ~5 us where its code and the batch are in cache, ~20-30 us inside a training step where
#: they are not (measured), so printing every batch would cost a millisecond loop 2-3 %.
FIRST_PRINTED = 8
PRINT_RUN = 8
PRINT_PERIOD = 128


#: A number for each loader followed, unique for the process's life. Not ``id(loader)``: Python
#: gives a freed object's id to the next one, and a DataLoader made anew every epoch often gets
#: the last one's, so its first pass read as the last one's continued (each batch "identical to
#: itself" on an unshuffled series).
_LOADER_NUMBERS = itertools.count()


class BatchPrint(NamedTuple):
    """One batch as the duplicate check sees it (a tuple: made on the data path, every batch)."""

    loader: int  # which loader (stable for the loader's lifetime)
    epoch: int  # pass over the loader, from 0
    position: int  # batch within the pass, from 0 (not `index`: a tuple has an index method)
    digest: int  # the fingerprint
    samples: int  # the batch's leading dimension
    values: int  # values in its first tensor (how much content the fingerprint stands for)
    shuffled: bool  # the loader draws its order at random
    replacement: bool  # ... with replacement (samples repeat within a pass by design)
    workers: int  # the loader's worker processes


def fingerprint(tensor: torch.Tensor) -> int | None:
    """A hash of a strided sample of a CPU tensor's values, its shape and dtype (None: empty)."""
    try:  # through numpy: a view and a slice, a few microseconds
        flat = (tensor.detach() if tensor.requires_grad else tensor).numpy().reshape(-1)
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks: their bytes
        flat = tensor.detach().reshape(-1).view(torch.uint8).numpy()
    size = flat.size
    if not size:
        return None
    sample = flat[:: size // SAMPLE_ELEMENTS or 1][:SAMPLE_ELEMENTS]
    return hash((tensor.shape, tensor.dtype, sample.tobytes()))


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (0 when there is none), for
    ``samples_per_s`` where the loop does not say (``tuimon run``, the framework callbacks)."""
    tensor = _first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() else 0


def _first_tensor(batch: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor in a batch: itself, or the first in a tuple, list or dict (nested a little)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if type(batch) is tuple and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]  # (inputs, labels): the common case, without the walk
    if depth > 3:
        return None
    items = batch if isinstance(batch, list | tuple) else batch.values() if isinstance(batch, Mapping) else ()
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def loader_sampler(source: Any) -> Any:
    """The sampler that orders a DataLoader's samples (a DataLoader, batch sampler or sampler
    given); None when there is none (an iterable dataset)."""
    for _ in range(3):  # loader (or its iterator) -> batch sampler -> sampler
        if isinstance(source, torch.utils.data.Sampler) and not hasattr(source, "sampler"):
            return source
        inner = next((found for name in ("sampler", "batch_sampler", "_index_sampler")
                      if (found := getattr(source, name, None)) is not None and found is not source), None)
        if inner is None:
            return None
        source = inner
    return None


def loader_shuffles(source: Any) -> tuple[bool, bool]:
    """Whether a DataLoader (batch sampler, sampler) draws its order at random, and whether with
    replacement: a RandomSampler, a WeightedRandomSampler, or a sampler that says ``shuffle``
    (DistributedSampler)."""
    sampler = loader_sampler(source)
    data = torch.utils.data
    random = isinstance(sampler, data.RandomSampler | data.WeightedRandomSampler | data.SubsetRandomSampler)
    random = random or getattr(sampler, "shuffle", False) is True
    return random, random and getattr(sampler, "replacement", False) is True


class LoaderPasses:
    """Numbers the passes over one loader and the batches within each pass."""

    def __init__(self, loader: Any) -> None:
        """``loader``: a DataLoader, or one of its iterators."""
        self.loader_id = next(_LOADER_NUMBERS)
        self.workers = int(getattr(loader, "num_workers", None) or getattr(loader, "_num_workers", 0) or 0)
        self.shuffled, self.replacement = loader_shuffles(loader)
        self.epoch = -1
        self.index = 0

    def new_pass(self) -> None:
        self.epoch += 1
        self.index = 0

    def print_of(self, batch: Any) -> BatchPrint | None:
        """The next batch's print (None when it has no CPU tensor to fingerprint)."""
        index = self.index
        self.index = index + 1
        if index >= FIRST_PRINTED and index % PRINT_PERIOD >= PRINT_RUN:
            return None
        tensor = _first_tensor(batch)
        if tensor is None or not tensor.is_cpu:
            return None
        digest = fingerprint(tensor)
        if digest is None:
            return None
        shape = tensor.shape
        return BatchPrint(self.loader_id, self.epoch if self.epoch > 0 else 0, index, digest,
                          shape[0] if shape else 1, tensor.numel(), self.shuffled, self.replacement,
                          self.workers)


class LoaderBook:
    """The pass counters of the loaders a process iterates, found again on each pass.

    Keyed by the loader's dataset and order (shuffled or not) rather than by the loader object:
    a DataLoader made anew every epoch, or one that makes a new iterator every epoch, is still
    the same stream of data, whose consecutive passes are worth comparing. Bounded: the oldest
    of more than :attr:`LIMIT` is forgotten.
    """

    LIMIT = 16

    def __init__(self) -> None:
        self._passes: dict[tuple[int, tuple[bool, bool]], LoaderPasses] = {}

    def passes_for(self, loader: Any) -> LoaderPasses:
        """The counter of ``loader`` (a DataLoader, one of its iterators, or any iterable)."""
        dataset = getattr(loader, "dataset", None) or getattr(loader, "_dataset", None) or loader
        key = (id(dataset), loader_shuffles(loader))
        passes = self._passes.get(key)
        if passes is None:
            passes = self._passes[key] = LoaderPasses(loader)
            if len(self._passes) > self.LIMIT:
                del self._passes[next(iter(self._passes))]
        return passes
