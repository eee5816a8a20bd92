"""Recordings (JSON Lines of wire messages) written and read back, as ``--record`` writes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from helpers.waiting import wait_until
from publisher.wire.protocol import decode, encode


def write_recording(
    path: Path, messages: list[dict[str, Any]], *, bad_lines: dict[int, bytes] | None = None
) -> Path:
    """Write ``messages`` as JSON Lines; ``bad_lines`` inserts raw lines at those (1-based) line numbers."""
    lines = [encode(message) for message in messages]
    for number, raw in sorted((bad_lines or {}).items()):
        lines.insert(number - 1, raw)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def read_messages(path: Path) -> list[dict[str, Any]]:
    """Every message of a recording, decoded (and so validated) as a viewer reads it."""
    return [decode(line) for line in path.read_bytes().splitlines()]


def wait_until_recorded(path: Path, step: int, timeout_s: float = 10.0) -> None:
    """Wait until the recording at ``path`` holds the metrics of ``step``: the Monitor's step
    worker has handled the steps so far (and its step clock has timed them)."""
    wait_until(lambda: path.exists() and any(m["type"] == "metrics" and m["step"] == step
                                             for m in read_messages(path)),
               timeout_s=timeout_s, what=f"step {step} in {path.name}")


def of_type(messages: Iterable[Mapping[str, Any]], msg_type: str) -> list[Any]:
    """The messages of one ``type``, in order."""
    return [m for m in messages if m["type"] == msg_type]
