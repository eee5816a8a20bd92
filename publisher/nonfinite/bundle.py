"""The repro bundle: what it takes to call the model again on the step that went non-finite.

Written once per episode of non-finite steps, next to the recording (else in the working
folder): the step's batch and the model's inputs (moved to the CPU), the RNG states (torch CPU
and CUDA at each model call, Python's ``random`` and numpy's at the anomaly), step, loss, lr,
seed, versions and the origin analysis; the weights only when asked (they can be large). The
format (:mod:`publisher.wire.repro_bundle`) keeps what ``tuimon repro show`` reads in JSON.
"""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from publisher.nonfinite.capture import ModelCall
from publisher.readings.sysinfo import reproduction_record, versions
from publisher.wire.repro_bundle import SUFFIX, write_bundle


def _portable(value: Any) -> Any:
    """A value ``torch.load(weights_only=True)`` reads back: tensors on the CPU, plain values, the
    rest as its ``repr``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _python_rng() -> dict[str, Any]:
    """Python's and (where imported) numpy's global RNG states, as JSON."""
    version, state, gauss = random.getstate()
    states: dict[str, Any] = {"python": [version, list(state), gauss]}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = [name, keys.tolist(), pos, has_gauss, cached]
    return states


def bundle_path(record: Path | None, run: str, rank: int, step: int) -> Path:
    """Next to the recording, else in the working folder."""
    folder = record.parent if record is not None else Path.cwd()
    stem = record.name.removesuffix(".jsonl") if record is not None else f"{run}.rank{rank}"
    return folder / f"{stem}.step{step}{SUFFIX}"


def write(path: Path, *, facts: dict[str, Any], origin: dict[str, Any], batch: Any,
          calls: list[ModelCall], seed: int | None, weights_of: nn.Module | None) -> Path:
    """Write the bundle; ``facts``: run, rank, step, loss, lr (what the manifest says first)."""
    tensors: dict[str, Any] = {
        "batch": tree_map(_portable, batch),
        "calls": [{"module": type(c.module).__name__, "args": tree_map(_portable, c.args),
                   "kwargs": tree_map(_portable, c.kwargs), "cpu_rng": c.cpu_rng, "cuda_rng": c.cuda_rng,
                   "outputs": [_portable(t) for t in c.outputs]}
                  for c in calls],
    }
    if weights_of is not None:
        tensors["weights"] = {k: v.detach().cpu() for k, v in weights_of.state_dict().items()}
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    manifest = {
        **facts,
        "seed": seed,
        "origin": origin,
        "versions": versions(),
        "reproduction": reproduction_record(seed=seed),
        "rng": _python_rng(),
        "holds": {"batch": batch is not None, "calls": len(calls), "weights": weights_of is not None},
        "inputs": [{"module": type(c.module).__name__, "args": _describe(c.args),
                    "kwargs": _describe(c.kwargs)} for c in calls],
        "batch": _describe(batch),
    }
    write_bundle(path, manifest, buffer.getvalue())
    return path


def _describe(value: Any) -> Any:
    """Shapes and dtypes of a structure's tensors, for the manifest."""
    return tree_map(lambda v: f"tensor{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
                    if isinstance(v, torch.Tensor) else _portable(v), value)
