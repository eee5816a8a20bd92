"""What ``tuimon run`` says when the command it ran has ended: how the run ended, the events it
raised, and where its recording and repro bundles are, read from each rank's account
(:mod:`publisher.wire.run_summary`). A run that ends in silence looks healthy whatever it did."""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from publisher.wire.run_summary import read_summaries

#: Seconds to wait for the ranks' last accounts once the command has ended: a publisher in a
#: process of its own notices its training process has gone within a second, then says how it ended.
WAIT_S = 3.0
#: Characters of the first critical event's message shown (the recording has all of it).
MESSAGE_CHARS = 200
#: Severities, the most serious first.
_SEVERITIES = ("critical", "warning", "info")


def collect(folder: Path, wait_s: float = WAIT_S) -> list[dict[str, Any]]:
    """Every rank's account, once each says it ended (or ``wait_s`` has passed)."""
    deadline = time.monotonic() + wait_s
    while True:
        accounts = read_summaries(folder)
        if all(account.get("ended") for account in accounts) or time.monotonic() >= deadline:
            return accounts
        time.sleep(0.1)


def worst_severity(accounts: Sequence[Mapping[str, Any]]) -> str | None:
    """The most serious severity of any event the run raised, None without events."""
    for severity in _SEVERITIES:
        if any(_events(account).get(severity) for account in accounts):
            return severity
    return None


def report_lines(accounts: Sequence[Mapping[str, Any]], *, wall_s: float, exit_status: int,
                 record: str | None) -> list[str]:
    """The lines of the summary (each printed after ``tuimon: ``)."""
    if not accounts:
        return [f"the command ended (exit status {exit_status}) after {wall_s:.1f} s without "
                "starting a publisher: none of its processes ran an optimizer step under PyTorch with "
                "tuimon's hooks"]
    steps = max((a["last_step"] for a in accounts if isinstance(a.get("last_step"), int)), default=None)
    run = accounts[0].get("run")
    minutes, seconds = divmod(round(wall_s), 60)
    took = f"{wall_s:.1f} s" if wall_s < 60 else f"{minutes} min {seconds} s"
    lines = [f"run {run} ended (exit status {exit_status}) after "
             + (f"{steps:,} steps in " if steps is not None else "")
             + f"{took}, {len(accounts)} rank{'s' if len(accounts) != 1 else ''}"]
    for account in accounts:
        who = f"rank {account.get('rank')} (pid {account.get('pid')} on {account.get('host')})"
        if not account.get("ended"):
            lines.append(f"  {who} ended without closing its publisher (killed?): its account stops there")
        elif account.get("status") != "completed":
            error = f": {account['error']}" if account.get("error") else ""
            lines.append(f"  {who} {account.get('status')}{error}")
    lines += _event_lines(accounts)
    recordings = [a["recording"] for a in accounts if a.get("recording")]
    if recordings:
        shown = recordings[0] + (f" and {len(recordings) - 1} more" if len(recordings) > 1 else "")
        lines.append(f"recording: {shown}")
        lines.append(f"  replay it: tuimon replay {shlex.quote(record or recordings[0])}")
    bundles = [bundle for a in accounts for bundle in a.get("repro") or ()]
    for bundle in bundles[:4]:
        lines.append(f"repro bundle: tuimon repro show {shlex.quote(bundle)}")
    if len(bundles) > 4:
        lines.append(f"  and {len(bundles) - 4} more repro bundles")
    return lines


def _event_lines(accounts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The events by severity, and the first critical one with its step and rank."""
    counts = {s: sum(_events(a).get(s, 0) for a in accounts) for s in _SEVERITIES}
    if not any(counts.values()):
        return ["events: none"]
    said = ", ".join(f"{counts[s]} {s}" for s in _SEVERITIES if counts[s])
    lines = [f"events: {said} (one per episode)"]
    criticals = [(a["first_critical"], a.get("rank")) for a in accounts if a.get("first_critical")]
    if criticals:
        critical, rank = min(criticals, key=lambda found: _step_order(found[0].get("step")))
        at = f" at step {critical['step']:,}" if isinstance(critical.get("step"), int) else ""
        kind, message = critical.get("kind"), str(critical.get("message"))
        if len(message) > MESSAGE_CHARS:
            message = message[: MESSAGE_CHARS - 1] + "…"
        lines.append(f"  the first critical: {kind}{at} on rank {rank}: {message}")
    return lines


def _step_order(step: Any) -> float:
    return step if isinstance(step, int) else float("inf")


def _events(account: Mapping[str, Any]) -> Mapping[str, int]:
    events = account.get("events")
    return events if isinstance(events, dict) else {}
