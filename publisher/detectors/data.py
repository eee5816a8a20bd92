"""Detectors that read the data a step consumed: the same batches coming again.

They read the batch fingerprints of :mod:`publisher.readings.batches` (taken on the data path by
``Monitor.track_data`` and ``tuimon run``'s DataLoader hook).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from publisher.detectors.base import Detector, Finding, where
from publisher.readings.batches import BatchPrint

#: Fingerprints remembered per pass over a loader (a pass with more batches forgets the oldest).
_REMEMBERED = 100_000
#: Batches of a pass remembered in order, for comparing the next pass's start with them.
_PREFIX = 64
#: A batch with fewer values than this is too small a sample to be unique: identical ones are
#: expected (single-sample batches of a few discrete features), and are not compared.
MIN_VALUES = 64


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


@dataclass
class _Passes:
    """One loader's current pass (fingerprints, and at which batch each came first) and the
    start of the previous pass, in order."""

    epoch: int = -1
    seen: OrderedDict[int, int] = field(default_factory=OrderedDict)
    current: list[int] = field(default_factory=list)
    previous: list[int] = field(default_factory=list)
    previous_batches: int = 0  # batches in the whole previous pass
    batches: int = 0  # so far in this pass (fingerprinted or not)
    replaying: bool = True  # this pass has matched the previous one's start so far


class DuplicateBatches(Detector):
    """The same batches come again: repeated across DataLoader workers, or a whole epoch replayed.

    Two tests on the fingerprints of each loader's batches:

    - **within a pass**: a batch identical to one already seen in the same pass. Every sample is
      drawn once per pass, so identical batches mean identical data: DataLoader workers seeded
      with one constant in ``worker_init_fn`` (each worker then yields the same batches: PyTorch's
      "Randomness in multi-process data loading" notes; Tanel Pärnamaa, "Using PyTorch + NumPy?
      You're making a mistake", 2021), or a procedural dataset that ignores the index. Not for
      samplers that draw with replacement (a WeightedRandomSampler oversampling a class), nor for
      batches of fewer than :data:`MIN_VALUES` values, where identical content is expected.
    - **across passes**, for a loader that shuffles: the new pass starts with the previous pass's
      batches, in the same order, for long enough that chance cannot explain it (the chance that
      a fair shuffle of N samples in batches of b repeats the first k batches is
      1/∏ C(N - i·b, b), i < k; reported below ``chance``, 1e-9, and after ``match`` batches at
      least): a sampler or worker seed reset every epoch, ``set_epoch`` never called on a
      ``DistributedSampler``. On a large dataset that is the second batch of the pass; on a tiny
      one it may never be, and a dataset smaller than a batch is never reported.

    Quiet on loaders that repeat by design: an unshuffled loader's passes (a validation loader)
    are not compared, and nothing is reported when the user says repeats are deliberate
    (``Monitor(repeated_batches=True)``, an overfit-one-batch check). Fingerprints are a strided
    sample of the inputs, so two different batches that agree on every sampled value would count
    as one: real data essentially never does.
    """

    quiet_to_close = 50

    def __init__(self, match: int = 2, chance: float = 1e-9) -> None:
        if match < 1 or not 0 < chance < 1:
            raise ValueError("DuplicateBatches: match >= 1, 0 < chance < 1")
        self.match = match
        self.log_chance = math.log(chance)
        self._loaders: dict[int, _Passes] = {}

    def observe_batches(self, step: int, batches: Sequence[BatchPrint]) -> Sequence[Finding]:
        if self.context.repeated_batches:
            return ()
        findings: list[Finding] = []
        for batch in batches:
            passes = self._loaders.setdefault(batch.loader, _Passes())
            if batch.epoch != passes.epoch:
                if passes.batches:
                    passes.previous, passes.previous_batches = passes.current, passes.batches
                passes.epoch, passes.current, passes.seen = batch.epoch, [], OrderedDict()
                passes.batches, passes.replaying = 0, True
            passes.batches = batch.position + 1  # not every batch is fingerprinted
            repeat = self._within_pass(passes, batch)
            if repeat is not None:
                findings.append(self._repeat(step, batch, repeat))
            if len(passes.current) < _PREFIX:
                passes.current.append(batch.digest)
            if batch.shuffled and self._replayed(passes, batch):
                findings.append(self._replay(step, batch, len(passes.current)))
        return findings

    @staticmethod
    def _within_pass(passes: _Passes, batch: BatchPrint) -> int | None:
        """The index of an earlier identical batch in this pass (None: none, or not compared)."""
        if batch.replacement or batch.values < MIN_VALUES:
            return None
        first = passes.seen.get(batch.digest)
        if first is None:
            passes.seen[batch.digest] = batch.position
            if len(passes.seen) > _REMEMBERED:
                passes.seen.popitem(last=False)
        return first

    def _replayed(self, passes: _Passes, batch: BatchPrint) -> bool:
        """Has this pass just become an improbable replay of the previous one's start?"""
        k = len(passes.current)
        if not passes.replaying or k > len(passes.previous) or passes.current[-1] != passes.previous[k - 1]:
            passes.replaying = False
            return False
        if k < self.match:
            return False
        size = batch.samples
        left = [passes.previous_batches * size - i * size for i in range(k)]  # samples left to draw from
        log_chance = -sum(_log_choose(n, size) for n in left if n >= size)
        if log_chance > self.log_chance:
            return False  # a small dataset: the same order again is no surprise yet
        passes.replaying = False  # reported once per pass
        return True
    def _repeat(self, step: int, batch: BatchPrint, first: int) -> Finding:
        workers = f", with {batch.workers} workers" if batch.workers > 1 else ""
        return Finding(
            "duplicate_batches",
            f"batch {batch.position} of pass {batch.epoch} over a data loader{workers} is identical to batch "
            f"{first} of the same pass: the same data is coming twice ({where(step, self.rank)})",
            {
                "test": "within a pass",
                "epoch": batch.epoch,
                "batch": batch.position,
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

    def _replay(self, step: int, batch: BatchPrint, compared: int) -> Finding:
        return Finding(
            "duplicate_batches",
            f"pass {batch.epoch} over a shuffling data loader starts with the same {compared} batches, in "
            f"the same order, as the previous pass: the shuffle is replaying ({where(step, self.rank)})",
            {
                "test": "epoch replayed",
                "epoch": batch.epoch,
                "batches_compared": compared,
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
