"""Anomaly detectors: each looks at one signal (loss, gradients, speed, GPUs) and reports findings.

The public face for writing and choosing detectors: subclass :class:`Detector`, return
:class:`Finding` s, and pass ``Monitor(detectors=[*default_detectors(), MyDetector()])``.

Names load on first use: the publisher's process imports the detectors that read only published
metrics (:mod:`publisher.detectors.published`) without torch, which the data detectors import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from publisher.detectors.base import Detector, Finding
    from publisher.detectors.detector_set import DetectorSet
    from publisher.detectors.suite import default_detectors

_PUBLIC = {
    "Detector": "publisher.detectors.base",
    "Finding": "publisher.detectors.base",
    "DetectorSet": "publisher.detectors.detector_set",
    "default_detectors": "publisher.detectors.suite",
}

__all__ = ["Detector", "DetectorSet", "Finding", "default_detectors"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'publisher.detectors' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
