"""Anomaly detectors: each looks at one signal (loss, gradients, speed, GPUs) and reports findings.

The public face for writing and choosing detectors: subclass :class:`Detector`, return
:class:`Finding` s, and pass ``Monitor(detectors=[*default_detectors(), MyDetector()])``.
"""

from __future__ import annotations

from publisher.detectors.base import Detector, Finding
from publisher.detectors.suite import DetectorSet, default_detectors

__all__ = ["Detector", "DetectorSet", "Finding", "default_detectors"]
