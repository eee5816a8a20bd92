"""Labels that cannot teach: one class only, or batches that each hold one class of many.

Both read the class-index labels of the looked-at ``cross_entropy``/``nll_loss`` calls
(:mod:`publisher.patches.loss_look`), one label per example (a target of shape (N,)): the labels
of a token or a pixel are neither independent nor one per example, and are left alone. What the
loss curve shows of either bug is misleading: a constant label is learned in a few dozen steps
(the loss falls to ~0.01, which looks like great training), and a class-sorted stream makes the
loss swing with each block while the model learns what it saw last (spikes, plateaus, dead units:
symptoms, not the cause).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from publisher.detectors.base import Detector, Finding, fmt, where
from publisher.patches.loss_look import LossLook
from publisher.patches.torch_calls import EAGER_LABELS

#: Recent batches shown in an event's details.
_SHOWN = 8


class _Labels:
    """The class-index labels looked at so far for one class count C: counts, and recent batches."""

    def __init__(self, classes: int, window: int) -> None:
        self.classes = classes
        self.counts = [0] * classes
        self.batches: deque[dict[int, int]] = deque(maxlen=window)  # each: class -> count
        self.last: dict[int, int] = {}  # the latest batch's, empty when all its labels were ignored

    def add(self, labels: tuple[int, ...]) -> None:
        self.last = batch = {k: n for k, n in enumerate(labels[:self.classes]) if n}
        for k, n in batch.items():
            self.counts[k] += n
        if batch:
            self.batches.append(batch)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def seen(self) -> dict[int, int]:
        """Counts of the classes seen, most frequent first (20 at most: a details field)."""
        ordered = sorted(((n, k) for k, n in enumerate(self.counts) if n), reverse=True)[:20]
        return {k: n for n, k in ordered}

    def recent(self) -> list[dict[int, int]]:
        return list(self.batches)[-_SHOWN:]


def _tracked(labels: _Labels | None, look: LossLook, window: int) -> _Labels | None:
    """The labels of ``look``'s class count with ``look``'s added (a new set when the count
    changed); None when ``look`` holds no class indices one per example."""
    if look.labels is None or not look.per_example or look.classes < 2:
        return None
    if labels is None or labels.classes != look.classes:
        labels = _Labels(look.classes, window)
    labels.add(look.labels)
    return labels


class SingleClassLabels(Detector):
    """Every training label seen is one class while the loss scores C >= 2 classes.

    A label column read from the wrong place (a constant, the first column, a filter that kept one
    class) trains a model that always answers that class: the loss falls to ~0.01 within a few
    dozen steps and accuracy is chance. Fires once ``labels`` (:data:`EAGER_LABELS`, 1,400)
    labels are in and all are one class: a class with a prevalence of 1 % or more is missing
    from 1,400 independent labels with probability 0.99^1400 < 1e-6, so an imbalanced set (5 %
    positives, batches with none) is quiet; a rarer class is not told from a missing one, and says
    itself in the event (its counts). Stops for good once a second class is seen.
    """

    quiet_to_close = 1_000_000  # the stream does not change its mind without a second class

    def __init__(self, labels: int = EAGER_LABELS) -> None:
        if labels < 1:
            raise ValueError("SingleClassLabels: labels >= 1")
        self.labels = labels
        self._seen: _Labels | None = None
        self._mixed = False

    def observe_loss_calls(self, step: int, looks: Sequence[LossLook]) -> Sequence[Finding]:
        finding: list[Finding] = []
        for look in looks:
            seen = _tracked(self._seen, look, _SHOWN)
            if seen is None:
                continue
            if seen is not self._seen:
                self._seen, self._mixed = seen, False
            counts = seen.seen()
            self._mixed = self._mixed or len(counts) > 1
            if self._mixed or seen.total < self.labels:
                continue
            [(label, total)] = counts.items()
            finding = [self._finding(step, look, seen, label, total)]
        return finding

    def _finding(self, step: int, look: LossLook, seen: _Labels, label: int, total: int) -> Finding:
        return Finding(
            "single_class_labels",
            f"every one of the {total} training labels seen is class {label}, while {look.function} at "
            f"{look.site} scores {seen.classes} classes: the model learns to always answer {label}, and "
            f"a falling loss means nothing ({where(step, self.rank)})",
            {
                "label": label,
                "labels_seen": total,
                "classes": seen.classes,
                "label_counts": seen.seen(),
                "recent_batches": seen.recent(),
                "function": look.function,
                "call_site": look.site,
                "target_shape": list(look.target_shape),
                "target_dtype": look.target_dtype,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "the label column read from the wrong place (a constant, an id, the wrong index)",
                    "a filter or join that kept one class only",
                    "labels overwritten in the loop (y = y * 0, a reused buffer)",
                ],
            },
        )


class ClassSortedBatches(Detector):
    """Batches that each hold one class while the stream holds many: data sorted by class, unshuffled.

    The model learns the class of the current block and forgets the others. Over the last
    ``window`` (64) looked-at batches, the number of one-class batches is compared with what
    shuffled batches would give: a batch of b labels drawn independently from the classes' shares
    p (those of every label looked at) is of one class with probability q = sum p_k^b; the count
    of one-class batches is then a sum of independent Bernoulli(q_i), whose upper tail is computed
    exactly (a Poisson-binomial). Fires when that tail is below ``alpha`` (1e-9: over a run's
    thousand tests, a false alarm in a million runs) and the window holds two classes or more.
    So imbalanced data (5 % positives: most batches of 8 have none, q = 0.66, and that is
    expected), tiny batches (b = 2 of 10 classes: q = 0.1) and unshuffled series whose batches are
    mixed are quiet, while ten classes in sorted blocks of 16-label batches (q ~ 1e-15 each) are
    told after a few batches past the first block's end.
    """

    quiet_to_close = 200

    def __init__(self, window: int = 64, alpha: float = 1e-9) -> None:
        if window < 2 or not 0 < alpha < 1:
            raise ValueError("ClassSortedBatches: window >= 2, 0 < alpha < 1")
        self.window = window
        self.alpha = alpha
        self._seen: _Labels | None = None
        self._sizes: deque[int] = deque(maxlen=window)
        self._single: deque[bool] = deque(maxlen=window)

    def observe_loss_calls(self, step: int, looks: Sequence[LossLook]) -> Sequence[Finding]:
        finding: list[Finding] = []
        for look in looks:
            seen = _tracked(self._seen, look, self.window)
            if seen is None:
                continue
            if seen is not self._seen:
                self._seen = seen
                self._sizes.clear()
                self._single.clear()
            if not seen.last:
                continue
            self._sizes.append(sum(seen.last.values()))
            self._single.append(len(seen.last) == 1)
            if not self._single[-1] or len({k for b in seen.batches for k in b}) < 2:
                continue
            chances, single = self._chances(seen), sum(self._single)
            # The exact tail costs ~0.5 ms (pure Python); a lower bound on it that already clears
            # alpha (the batches most likely to be of one class all being so) spares it.
            likeliest = sorted(chances)[-single:]
            if min(likeliest) > 0 and math.fsum(map(math.log, likeliest)) >= math.log(self.alpha):
                continue
            p_value = poisson_binomial_tail(chances, single)
            if p_value < self.alpha:
                finding = [self._finding(step, look, seen, p_value, math.fsum(chances))]
        return finding

    def _chances(self, seen: _Labels) -> list[float]:
        """Each window batch's chance of being of one class under shuffling: sum p_k^b."""
        total = seen.total
        shares = [n / total for n in seen.counts if n]
        return [min(1.0, sum(p ** size for p in shares)) for size in self._sizes]

    def _finding(self, step: int, look: LossLook, seen: _Labels, p_value: float, expected: float) -> Finding:
        single, batches = sum(self._single), len(self._single)
        classes_seen = sum(1 for n in seen.counts if n)
        return Finding(
            "class_sorted_batches",
            f"{single} of the last {batches} batches looked at each hold a single class, while the labels "
            f"span {classes_seen} classes: shuffled batches would give {fmt(expected)} (chance "
            f"{p_value:.1e}); the data comes sorted by class, and the model learns the last block it saw "
            f"({look.function} at {look.site}, {where(step, self.rank)})",
            {
                "single_class_batches": single,
                "batches_looked_at": batches,
                "expected_if_shuffled": expected,
                "p_value": p_value,
                "classes": seen.classes,
                "classes_seen": classes_seen,
                "label_counts": seen.seen(),
                "recent_batches": seen.recent(),
                "batch_size": self._sizes[-1],
                "function": look.function,
                "call_site": look.site,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "DataLoader(shuffle=False) over a dataset stored sorted by class (ImageFolder order)",
                    "a sampler that walks the indices in order, or a stream written class by class",
                    "a class-balanced sampler that draws each batch from one class (say so if deliberate)",
                ],
            },
        )


def poisson_binomial_tail(chances: Sequence[float], at_least: int) -> float:
    """P(X >= ``at_least``) for X a sum of independent Bernoulli(``chances``): the exact recursion
    over the count's distribution (O(n^2), n <= the window)."""
    if at_least <= 0:
        return 1.0
    distribution = [1.0]
    for q in chances:
        shifted = [0.0, *distribution]
        distribution = [(1 - q) * a + q * b for a, b in zip([*distribution, 0.0], shifted, strict=True)]
    return math.fsum(distribution[at_least:])
