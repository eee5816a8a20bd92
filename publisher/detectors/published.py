"""The detectors that judge a step from its published ``metrics`` alone, and so can run in the
publisher's process, off the training process's GIL.

Threads of the training process share its GIL: the Python a step worker runs is paid by the
training thread in waits for it, about one for one on a 2-core machine (docs/benchmarks.md;
``benchmarks/gil_share.py``: the detector suite's work cost a ~1 ms MLP step 1.066x in a thread
and 1.009x in a process of its own). The detectors below read nothing but a step's ``metrics``
(and the :class:`~publisher.detectors.base.TrainingContext`, which the Monitor shares with the
publisher's process as it changes), which that process publishes anyway: with the default suite
they run there, on each step's message as it is published (:mod:`publisher.publisher_process`);
the step worker runs the others (per-layer samples, batches, loss calls, GPU readings). A list of
your own (``Monitor(detectors=[...])``) runs whole on the step worker: its detectors are objects of
the training process, whose settings another process cannot rebuild, and the publisher's process
never unpickles what it is sent. Where the publisher cannot have a process of its own, every
detector runs on the step worker, as before.

This module and the detectors it names import no torch, so that the publisher's process stays small
(about 24 MB on Linux).
"""

from __future__ import annotations

from typing import Any

from publisher.detectors.base import Detector
from publisher.detectors.detector_set import DetectorSet
from publisher.detectors.grads import ClipNoop, GradExplosion
from publisher.detectors.loss import ChanceLoss, LossPlateau, LossSpike
from publisher.detectors.speed import DataBottleneck, MemoryGrowth, StepTimeOutlier, ThroughputDrop
from publisher.wire.protocol import read_number
from publisher.wire.replay import add_replay, replay_record
from publisher.wire.sidecar import Publish

#: The prefix of the ids of the events made there (the training process's have none): unique per rank.
EVENT_ID_PREFIX = "p"

#: Class name -> class, of the default detectors whose only hook is ``observe_step``.
ON_PUBLISHED_METRICS: dict[str, type[Detector]] = {
    cls.__name__: cls for cls in (LossSpike, LossPlateau, ChanceLoss, GradExplosion, ClipNoop,
                                  ThroughputDrop, StepTimeOutlier, DataBottleneck, MemoryGrowth)
}


def split_defaults(defaults: list[Detector]) -> tuple[list[Detector], list[str]]:
    """The default suite parted: the detectors the step worker runs, and the names of those the
    publisher's process builds afresh (each with its default settings, as in ``defaults``)."""
    here: list[Detector] = []
    there: list[str] = []
    for detector in defaults:
        name = type(detector).__name__
        if ON_PUBLISHED_METRICS.get(name) is type(detector):
            there.append(name)
        else:
            here.append(detector)
    return here, there


def build(names: list[str]) -> list[Detector]:
    """Fresh detectors by name; raises ValueError for a name not in :data:`ON_PUBLISHED_METRICS`."""
    unknown = [name for name in names if name not in ON_PUBLISHED_METRICS]
    if unknown:
        raise ValueError(f"not detectors of published metrics: {', '.join(unknown)}")
    return [ON_PUBLISHED_METRICS[name]() for name in names]


class PublishedMetricsDetectors:
    """A :class:`~publisher.wire.sidecar.Watcher` for the publisher's process: runs the detectors
    named in ``settings`` on each ``metrics`` message published, and publishes their events with
    the ``replay`` record of the ``run_start`` it saw go out."""

    def __init__(self, settings: dict[str, Any], publish: Publish) -> None:
        self._run, self._rank = str(settings["run"]), int(settings["rank"])
        self._publish = publish
        self._replay: dict[str, Any] = {}
        self.detectors = DetectorSet(build(list(settings.get("detectors") or ())), self._emit,
                                     rank=self._rank, id_prefix=EVENT_ID_PREFIX)

    def published(self, msg_type: str, step: int | None, body: dict[str, Any]) -> None:
        if msg_type == "metrics" and step is not None:
            metrics = body.get("metrics")
            if not isinstance(metrics, dict):
                raise TypeError(f"its metrics are not an object of numbers: {metrics!r:.80}")
            try:  # numbers on the wire, but for NaN and infinities: "nan", "inf", "-inf"
                sum(metrics.values())
            except TypeError:
                metrics = {name: read_number(value) for name, value in metrics.items()}
            self.detectors.observe_step(step, metrics)
        elif msg_type == "run_start":
            self._replay = replay_record(self._run, self._rank, body.get("seed"), body.get("repro") or {})

    def context(self, fields: dict[str, Any]) -> None:
        self.detectors.context.update(**fields)

    def close(self) -> None:
        self.detectors.close()

    def _emit(self, step: int | None, body: dict[str, Any]) -> None:
        add_replay(body, self._replay, step)
        self._publish("event", step, body)
