"""The ``replay`` record an event carries: what reproduces the run up to the event's step.

Sent once in full in ``run_start`` (``repro``, docs/protocol.md) and, cut to what names the run, in
every episode's event, so that an incident opened from one event says how to get back there. Made
in two places of a rank, the step worker (events of the training process) and the publisher's
process (events of the detectors that run there, from the ``run_start`` it publishes), from one
function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from publisher.wire.jsonsafe import json_safe


def replay_record(run: str, rank: int, seed: Any, repro: Mapping[str, Any]) -> dict[str, Any]:
    """The record from ``run_start``'s ``seed`` and ``repro``."""
    return json_safe({"run": run, "rank": rank, "seed": seed, "torch_seed": repro.get("torch_seed"),
                      "config_hash": repro.get("config_hash"), "git": repro.get("git"),
                      "argv": repro.get("argv")})


def add_replay(body: dict[str, Any], replay: Mapping[str, Any], step: int | None) -> None:
    """Put ``replay`` with the event's ``step`` in an event body's details."""
    body["details"] = {**body["details"], "replay": {**replay, "step": step}}
