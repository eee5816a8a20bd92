"""Open a repro bundle in a notebook: the inputs and states of the step that went non-finite.

    from publisher import repro
    case = repro.load("run.rank0.pid42.step60.repro.zip")
    case.origin                      # where the first NaN came from (module, phase, reproduced)
    args, kwargs = case.inputs()     # the model's arguments at that step (CPU tensors)
    case.restore_rng()               # torch, CUDA, Python and numpy RNG states as they were
    model.load_state_dict(case.weights)  # when the bundle holds them (repro_weights=True)
    out = model(*args, **kwargs)

The bundle is written by :mod:`publisher.nonfinite.bundle`; its manifest is JSON (what
``tuimon repro show`` prints) and its tensors are read with ``torch.load(weights_only=True)``:
no pickled code runs.
"""

from __future__ import annotations

import io
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from publisher.wire.repro_bundle import read_manifest, read_tensors


@dataclass
class Repro:
    """A repro bundle, loaded: ``manifest`` (JSON) and ``tensors`` (batch, calls, weights)."""

    path: Path
    manifest: dict[str, Any]
    tensors: dict[str, Any]

    @property
    def origin(self) -> dict[str, Any]:
        return dict(self.manifest.get("origin") or {})

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def batch(self) -> Any:
        """The step's batch as the data loader gave it (None when the batch was not seen)."""
        return self.tensors.get("batch")

    @property
    def weights(self) -> dict[str, torch.Tensor] | None:
        """The model's ``state_dict`` before the update (``repro_weights=True``), else None."""
        return self.tensors.get("weights")

    def inputs(self, call: int | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The model's arguments at one of the step's calls: the one that reproduced the fault, else
        the first."""
        calls = self.tensors.get("calls") or []
        if not calls:
            raise LookupError(f"{self.path.name} holds no model call (the model was unknown at that step)")
        index = self.origin.get("call", 0) if call is None else call
        chosen = calls[index or 0]
        return tuple(chosen["args"]), dict(chosen["kwargs"])

    def restore_rng(self, call: int | None = None) -> None:
        """Put back the RNG states of the step: torch's (CPU, and CUDA where the bundle has them) at
        the model call, Python's and numpy's as they were at the anomaly."""
        calls = self.tensors.get("calls") or []
        if calls:
            chosen = calls[(self.origin.get("call", 0) if call is None else call) or 0]
            if chosen.get("cpu_rng") is not None:
                torch.set_rng_state(chosen["cpu_rng"])
            if chosen.get("cuda_rng") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(chosen["cuda_rng"])
        states = self.manifest.get("rng") or {}
        if "python" in states:
            version, state, gauss = states["python"]
            random.setstate((version, tuple(state), gauss))
        numpy = sys.modules.get("numpy")
        if "numpy" in states and numpy is not None:
            name, keys, pos, has_gauss, cached = states["numpy"]
            numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached))


def load(path: str | Path) -> Repro:
    """Read a bundle; ``ValueError`` for a file that is not one."""
    path = Path(path)
    manifest = read_manifest(path)
    tensors = torch.load(io.BytesIO(read_tensors(path)), weights_only=True)
    return Repro(path, manifest, tensors)
