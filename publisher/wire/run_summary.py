"""Each rank's account of how its run ended, for the command that started it (``tuimon run``).

``tuimon run`` names a folder in ``$TUIMON_SUMMARY_DIR``; each publisher of the job writes one JSON
file there when it starts (``"ended": false``) and rewrites it when it sends ``run_end``: its last
step, its status, the events it sent (one per episode, at its worst severity, with the first
critical one), where its recording and repro bundles went. The publisher already holds every
episode's latest update for late joiners, so the account costs nothing while training runs. A
file left at ``"ended": false`` is a process that ended without closing its publisher (killed).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The environment variable naming the folder (set by ``tuimon run``; unset, nothing is written).
SUMMARY_DIR_ENV = "TUIMON_SUMMARY_DIR"


def summary_path(folder: str | os.PathLike[str], rank: int, pid: int) -> Path:
    return Path(folder) / f"rank{rank}.pid{pid}.json"


def write_summary(path: Path, account: Mapping[str, Any]) -> None:
    """Write ``account`` at ``path`` whole or not at all (a reader never sees half a file)."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(account))
    os.replace(partial, path)


def account(*, run: str, rank: int, host: str, pid: int, ended: bool, last_step: int | None = None,
            status: str | None = None, error: str | None = None, recording: str | None = None,
            events: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """One rank's account; ``events``: the latest update of each episode it sent."""
    severities = {"critical": 0, "warning": 0, "info": 0}
    first_critical: dict[str, Any] | None = None
    repro: list[str] = []
    for event in events:
        severity = event.get("severity")
        if severity in severities:
            severities[severity] += 1
        if severity == "critical" and (first_critical is None or _before(event, first_critical)):
            first_critical = {key: event.get(key) for key in ("kind", "step", "message")}
        details = event.get("details")
        bundle = details.get("repro") if isinstance(details, Mapping) else None
        if isinstance(bundle, str) and bundle not in repro:
            repro.append(bundle)
    return {"run": run, "rank": rank, "host": host, "pid": pid, "ended": ended, "last_step": last_step,
            "status": status, "error": error, "recording": recording, "events": severities,
            "first_critical": first_critical, "repro": repro}


def _before(event: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    step, other_step = event.get("step"), other.get("step")
    return isinstance(step, int) and (not isinstance(other_step, int) or step < other_step)


def read_summaries(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every account in ``folder``, by rank; an unreadable file is left out."""
    found = []
    for path in sorted(Path(folder).glob("rank*.pid*.json")):
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict):
                found.append(loaded)
    return sorted(found, key=lambda summary: (summary.get("rank", 0), summary.get("pid", 0)))
