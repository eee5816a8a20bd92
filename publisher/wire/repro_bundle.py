"""The repro bundle's container, readable without torch (``tuimon repro show`` reads it).

A bundle is a zip archive: ``manifest.json`` says what happened (step, loss, lr, seed, versions,
where the non-finite value came from, what the tensors hold) and ``tensors.pt`` holds the step's
batch, the model's inputs, the RNG states and, when asked, the weights, saved with
``torch.save`` and read back only by :func:`publisher.repro.load` with
``torch.load(weights_only=True)``. The part a viewer reads is JSON: nothing in it is unpickled.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

#: What a step with non-finite gradients does (``Monitor(on_nonfinite=)``, ``tuimon run
#: --on-nonfinite``): here so that the viewer's command line offers the same words without torch.
POLICIES = ("report", "skip", "stop")
#: The JSON member: what a bundle says, readable anywhere.
MANIFEST = "manifest.json"
#: The tensors, saved by ``torch.save``.
TENSORS = "tensors.pt"
#: The bundle format's version, in the manifest.
FORMAT = 1
#: The file name's ending.
SUFFIX = ".repro.zip"


def write_bundle(path: Path, manifest: dict[str, Any], tensors: bytes) -> None:
    """Write a bundle atomically enough: to a temporary name, then renamed."""
    partial = path.with_name(path.name + ".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(MANIFEST, json.dumps({"format": FORMAT, **manifest}, indent=1, default=str))
        archive.writestr(TENSORS, tensors)
    partial.replace(path)


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A bundle's manifest; ``ValueError`` for a file that cannot be read or is not one."""
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MANIFEST))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a tuimon repro bundle ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tuimon repro bundle of format {FORMAT}")
    return manifest


def read_tensors(path: str | Path) -> bytes:
    """The ``torch.save`` member, as bytes (for :func:`publisher.repro.load`)."""
    with zipfile.ZipFile(path) as archive:
        return archive.read(TENSORS)
