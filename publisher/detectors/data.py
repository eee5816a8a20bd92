"""Detectors that read the data a step consumed: the same batches coming again.

They read the batch fingerprints of :mod:`publisher.collect.batches` (taken on the data path by
``Monitor.track_data`` and ``tuimon run``'s DataLoader hook).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from publisher.collect.batches import BatchPrint
from publisher.detectors.base import Detector, Finding, where

#: Fingerprints remembered per pass over a loader (a pass with more batches forgets the oldest).
_REMEMBERED = 100_000


@dataclass
class _Passes:
    """One loader's current pass (fingerprints, and at which batch each came first) and the
    previous pass's fingerprints in order."""

    epoch: int = -1
    seen: OrderedDict[int, int] = field(default_factory=OrderedDict)
    current: list[int] = field(default_factory=list)
    previous: list[int] = field(default_factory=list)


class DuplicateBatches(Detector):
    """The same batches come again: repeated across DataLoader workers, or a whole epoch replayed.

    Two tests on the fingerprints of each loader's batches:

    - **within a pass**: a batch identical to one already seen in the same pass. Every sample is
      drawn once per pass, so identical batches mean identical data: DataLoader workers seeded
      with one constant in ``worker_init_fn`` (each worker then yields the same batches: PyTorch's
      "Randomness in multi-process data loading" notes; Tanel Pärnamaa, "Using PyTorch + NumPy? You're
      making a mistake", 2021), or a procedural dataset that ignores the index;
    - **across passes**, for a loader that shuffles: the first ``match`` (3) batches of a pass equal
      the previous pass's first ``match``, in order: the shuffle is replaying (a sampler or worker
      seed reset every epoch, ``set_epoch`` never called on a ``DistributedSampler``).

    Quiet on loaders that repeat by design: an unshuffled loader's passes (a validation loader)
    are not compared, a pass of fewer than ``match`` batches (a dataset smaller than a few batches)
    neither, and nothing is reported when the user says repeats are deliberate
    (``Monitor(repeated_batches=True)``, an overfit-one-batch check). Fingerprints are a strided
    sample of the inputs, so two different batches that agree on every sampled value would count
    as one: real data essentially never does.
    """

    quiet_to_close = 50

    def __init__(self, match: int = 3) -> None:
        if match < 1:
            raise ValueError("DuplicateBatches: match >= 1")
        self.match = match
        self._loaders: dict[int, _Passes] = {}

    def observe_batches(self, step: int, batches: Sequence[BatchPrint]) -> Sequence[Finding]:
        if self.context.repeated_batches:
            return ()
        findings: list[Finding] = []
        for batch in batches:
            passes = self._loaders.setdefault(batch.loader, _Passes())
            if batch.epoch != passes.epoch:
                if passes.current:
                    passes.previous = passes.current
                passes.epoch, passes.current, passes.seen = batch.epoch, [], OrderedDict()
            first = passes.seen.get(batch.digest)
            if first is not None:
                findings.append(self._repeat(step, batch, first))
            else:
                passes.seen[batch.digest] = batch.index
                if len(passes.seen) > _REMEMBERED:
                    passes.seen.popitem(last=False)
            if len(passes.current) < self.match:
                passes.current.append(batch.digest)
                if (batch.shuffled and len(passes.current) == self.match
                        and passes.current == passes.previous[: self.match]):
                    findings.append(self._replay(step, batch))
        return findings

    def _repeat(self, step: int, batch: BatchPrint, first: int) -> Finding:
        workers = f", with {batch.workers} workers" if batch.workers > 1 else ""
        return Finding(
            "duplicate_batches",
            f"batch {batch.index} of pass {batch.epoch} over a data loader{workers} is identical to batch "
            f"{first} of the same pass: the same data is coming twice ({where(step, self.rank)})",
            {
                "test": "within a pass",
                "epoch": batch.epoch,
                "batch": batch.index,
                "same_as_batch": first,
                "workers": batch.workers,
                "shuffled": batch.shuffled,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "DataLoader workers seeded with the same constant in worker_init_fn "
                    "(every worker yields the same batches)",
                    "a dataset whose __getitem__ ignores the index (draws from an RNG, returns a cache)",
                    "a deliberate overfit-one-batch check: say so with Monitor(repeated_batches=True)",
                ],
            },
            key=("pass", batch.loader),
        )

    def _replay(self, step: int, batch: BatchPrint) -> Finding:
        return Finding(
            "duplicate_batches",
            f"pass {batch.epoch} over a shuffling data loader starts with the same {self.match} batches, in "
            f"the same order, as the previous pass: the shuffle is replaying ({where(step, self.rank)})",
            {
                "test": "epoch replayed",
                "epoch": batch.epoch,
                "batches_compared": self.match,
                "workers": batch.workers,
                "shuffled": batch.shuffled,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "the sampler's generator or the worker seeds are reset to the same value every epoch",
                    "DistributedSampler.set_epoch(epoch) is never called (every epoch has one order)",
                    "the random state is restored from a checkpoint at every epoch",
                ],
            },
            key=("epochs", batch.loader),
        )
