"""The detectors a Monitor runs unless told otherwise.

Adding a detector: subclass :class:`~publisher.detectors.base.Detector` in the module of
``publisher/detectors/`` for its signal (loss, grads, speed, gpu), override ``observe_step``,
``observe_layers`` and/or ``observe_gpu``, return findings whose ``kind`` is in
:data:`publisher.wire.event_kinds.EVENT_KINDS` (a runbook exists for each), say in the
docstring which public source its defaults come from, and list it here (and in
:mod:`publisher.detectors.published` if it reads nothing but a step's metrics).
"""

from __future__ import annotations

from publisher.detectors.base import Detector
from publisher.detectors.data import DuplicateBatches
from publisher.detectors.gpu import GpuEcc, GpuImbalance, GpuLowUtil, GpuThrottle
from publisher.detectors.grads import (
    ClipNoop,
    DeadActivations,
    GradExplosion,
    NonFiniteGrads,
    NonFiniteParams,
    UpdateRatio,
    VanishingGradient,
)
from publisher.detectors.labels import ClassSortedBatches, SingleClassLabels
from publisher.detectors.loss import ChanceLoss, LossPlateau, LossSpike, NonFiniteLoss
from publisher.detectors.loss_inputs import LossInputMismatch
from publisher.detectors.schedule import LrVanished
from publisher.detectors.speed import DataBottleneck, MemoryGrowth, StepTimeOutlier, ThroughputDrop


def default_detectors() -> list[Detector]:
    """The detectors a Monitor runs unless told otherwise (a fresh instance each call).

    Each takes its thresholds as constructor arguments; pass your own list to ``Monitor(detectors=...)``
    to change them, e.g. ``[*default_detectors()[:-1], GpuLowUtil(p95=50)]``.
    """
    return [
        NonFiniteLoss(), LossSpike(), LossPlateau(), ChanceLoss(), LrVanished(),
        LossInputMismatch(), SingleClassLabels(), ClassSortedBatches(),
        GradExplosion(), NonFiniteGrads(), NonFiniteParams(), VanishingGradient(), UpdateRatio(), ClipNoop(),
        DeadActivations(),
        ThroughputDrop(), StepTimeOutlier(), DataBottleneck(), MemoryGrowth(), DuplicateBatches(),
        GpuImbalance(), GpuThrottle(), GpuEcc(), GpuLowUtil(),
    ]
