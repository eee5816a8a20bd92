"""The detector contract: what a detector sees, and the :class:`Finding` it answers with.

Kept apart from the detectors themselves (one module per signal beside this one) and from the
episode logic (:mod:`publisher.detectors.episodes`) so that every detector module depends on this
one only. Observations are plain numbers: a step's metrics, a GPU reading, a sampled per-layer
:class:`~publisher.stats.layer_sample.LayerSample` already fetched to the host, or the
fingerprints of the step's batches. What a detector knows about the training besides its
numbers (how many optimizers, how many classes the loss scores) is the set's shared
:class:`TrainingContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from publisher.wire.event_kinds import EVENT_KINDS

if TYPE_CHECKING:
    from publisher.patches.loss_look import LossLook
    from publisher.readings.batches import BatchPrint
    from publisher.stats.layer_sample import LayerSample

Metrics = Mapping[str, float]
Devices = Sequence[Mapping[str, Any]]


@dataclass(slots=True)
class TrainingContext:
    """What the Monitor tells its detectors about the training, besides the numbers of each step.

    Written from the training thread through :meth:`update`, read from the step worker's; every
    field is replaced whole (no lock needed). ``on_update`` hears each change: the detectors that
    run in the publisher's process get it from there (:mod:`publisher.detectors.published`).
    ``optimizers``: how many optimizers step (more than one is adversarial or
    multi-objective training, whose losses are not expected to fall on their own). ``classes``:
    the number of classes the classification loss scores (from the logits' shape, seen by the
    watch of the losses), ``label_entropy``: the entropy of the labels seen, in nats (the loss
    of a model that predicts the label prior). ``repeated_batches``: the user said repeated batches
    are deliberate (an overfit-one-batch check).
    """

    optimizers: int = 1
    classes: int | None = None
    label_entropy: float | None = None
    repeated_batches: bool = False
    on_update: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False, compare=False)

    def update(self, **changes: Any) -> None:
        """Replace the fields named in ``changes`` and tell :attr:`on_update` (raises ValueError
        for a name that is not a field, before changing any)."""
        unknown = [name for name in changes if name not in _CONTEXT_FIELDS]
        if unknown:
            raise ValueError(f"not fields of the training context: {', '.join(unknown)}")
        for name, value in changes.items():
            setattr(self, name, value)
        if self.on_update is not None:
            self.on_update(changes)


#: What :meth:`TrainingContext.update` may change.
_CONTEXT_FIELDS = frozenset(item.name for item in fields(TrainingContext)) - {"on_update"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One detector's verdict on one observation: what was seen, how bad, and the numbers.

    ``key`` separates simultaneous episodes of the same kind (the GPU index for GPU findings, the
    memory series for memory growth). ``severity`` None means the kind's default from
    ``EVENT_KINDS``.
    """

    kind: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None
    key: Any = None

    def resolved_severity(self) -> str:
        if self.severity is not None:
            return self.severity
        known = EVENT_KINDS.get(self.kind)
        return known.default_severity if known else "info"


class Detector:
    """Base class. Override the ``observe_*`` hooks you need; each returns findings (or ``()``).

    ``rank`` and ``context`` are set by the :class:`~publisher.detectors.DetectorSet`: where
    something happened, and what is known about the training. All hooks of one detector are
    called from one thread at a time.
    """

    #: Observations without a finding after which an open episode of this detector ends.
    quiet_to_close: int = 20
    #: Whether ``observe_layers`` also wants the gradients-only samples of steps whose gradient
    #: norm was not finite (other detectors neither see them nor age their episodes on them).
    reads_partial_samples: bool = False
    rank: int = 0
    context: TrainingContext = TrainingContext()

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        """Called once per optimizer step with that step's metrics (``loss`` when known).

        Return ``()`` when nothing is wrong (a list or tuple, not a generator: emptiness is the
        fast path).
        """
        return ()

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        """Called on sampled steps with per-parameter and per-module statistics (after the step's
        ``observe_step``), and on steps whose gradient norm was not finite (gradients only)."""
        return ()

    def observe_gpu(self, step: int | None, devices: Devices) -> Sequence[Finding]:
        """Called once per GPU sample with the protocol's device dicts; ``step`` is the latest."""
        return ()

    def observe_batches(self, step: int, batches: Sequence[BatchPrint]) -> Sequence[Finding]:
        """Called with the fingerprints of the batches a step consumed (when the Monitor sees the
        data path: ``Monitor.track_data`` or ``tuimon run``), after the step's ``observe_step``."""
        return ()

    def observe_loss_calls(self, step: int, looks: Sequence[LossLook]) -> Sequence[Finding]:
        """Called with the looks at the watched loss calls (:mod:`publisher.patches.torch_calls`)
        that reached the host by this step, after the step's ``observe_step``."""
        return ()


def overrides(detector: Detector, hook: str) -> bool:
    """Whether ``detector``'s class implements ``hook`` (so the set never calls empty hooks)."""
    return getattr(type(detector), hook) is not getattr(Detector, hook)


def where(step: int | None, rank: int) -> str:
    return f"step {step}, rank {rank}" if step is not None else f"rank {rank}"


def fmt(value: float | None) -> str:
    """Compact number for a one-line message: 3 significant digits, scientific when extreme."""
    return "n/a" if value is None else f"{value:.3g}"


class Streak:
    """Counts consecutive observations for which a condition held (a confirmation rule)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def update(self, condition: bool) -> int:
        self.count = self.count + 1 if condition else 0
        return self.count


def name_list(names: Sequence[str], limit: int = 6) -> str:
    """``a, b, c and 4 more``: parameter lists short enough for a one-line message."""
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"
