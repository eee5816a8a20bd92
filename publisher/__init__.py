"""tuimon's training side: embed a :class:`Monitor` in a PyTorch loop (or use ``tuimon run``).

The public face: everything a training script needs is importable from here, whatever folder it
lives in (``from publisher import Monitor, StatsConfig, InvariantConfig``). The folders say what
each part does:

- ``monitor.py``: the :class:`Monitor` façade, the training thread's side; ``wiring.py`` builds
  its collaborators; ``completion.py`` turns what the training thread captured into the step's
  metrics and ``reporter.py`` publishes each finished step, event and GPU reading and shows them to
  the detectors, both off the training thread; ``telemetry_errors.py`` counts what failed;
- ``wire/``: what crosses the process boundary (protocol, publisher socket, recording, registry);
- ``readings/``: what the training thread reads: a step's numbers (timing, compute time, memory,
  batch fingerprints, the trained parameters), and once, who the process is;
- ``threads/``: what runs beside the training thread (step worker, hang watchdog, GPU sampling
  through NVML);
- ``patches/``: wrappers over torch functions (gradient clipping, the classification loss);
- ``measure/``: what the statistics and the checks share (cost budgets, the device fetch, the base
  of hooked checks, torch helpers);
- ``stats/``: per-layer statistics;
- ``detectors/``: anomaly detectors and the episodes that fold their findings into events;
- ``invariants/``: training invariants (after TrainCheck, OSDI 2025) checked from hooks;
- ``nonfinite/``: where a NaN or Inf came from (the step re-run, module by module), what the step
  does (report, skip, stop) and the repro bundle; ``repro.py`` opens a bundle in a notebook;
- ``autohook/``: zero-code instrumentation for ``tuimon run``.

This package never imports textual, sqlite-utils or the ``tuimon`` app (checked by import-linter):
it runs inside the training process, where every import and every microsecond counts. Names are
imported lazily so that ``publisher.wire`` stays importable without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time the names load on first use
    from publisher.detectors.base import Detector, Finding
    from publisher.detectors.suite import default_detectors
    from publisher.invariants.config import InvariantConfig
    from publisher.monitor import Monitor
    from publisher.stats.sampler import StatsConfig
    from publisher.wire.event_kinds import EVENT_KINDS

#: Public name -> the module that defines it.
_PUBLIC = {
    "Monitor": "publisher.monitor",
    "StatsConfig": "publisher.stats.sampler",
    "InvariantConfig": "publisher.invariants.config",
    "Detector": "publisher.detectors.base",
    "Finding": "publisher.detectors.base",
    "default_detectors": "publisher.detectors.suite",
    "EVENT_KINDS": "publisher.wire.event_kinds",
}

__all__ = [
    "EVENT_KINDS",
    "Detector",
    "Finding",
    "InvariantConfig",
    "Monitor",
    "StatsConfig",
    "default_detectors",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'publisher' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
