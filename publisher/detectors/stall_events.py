"""Stall events: the hang watchdog's verdicts as events of the process itself, one rank, no relay.

The watchdog (:mod:`publisher.threads.watchdog`) judges the training thread with the one definition
of a stall (:mod:`publisher.wire.stall`) and tells :class:`StallEvents` each verdict past the
threshold, on its own thread. Each becomes a finding of the stall's episode
(:class:`~publisher.detectors.episodes.EpisodeTracker`: announced once, updated at most every 2 s
while it lasts, escalated at once), so a stall reaches everything that reads events: recordings,
``tuimon tail``, the dashboard, alerts and the Prometheus export. When steps resume the episode
is closed by a last update that says how long the pause lasted.

- **stuck** -> ``hang``: ``warning`` at the threshold, ``critical`` once it lasts; in a job of
  several ranks it says that this rank is outside any collective, so the others will wait for it:
  the culprit is named by its own first warning (PyTorch's Flight Recorder names the rank missing
  from a collective the same way, after the fact:
  https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html).
- **waiting** in a collective -> ``collective_wait``, ``info``: this rank waits for another and is
  not hung itself.
- **busy** -> ``busy_pause``: ``info`` when the pause outlasts every earlier one by half again
  (the first validation pass is noted, the next ones of the same length are not), ``warning`` far
  beyond anything the run has shown (:meth:`publisher.wire.stall.Stall.severity`).

The longest earlier pause is the longest stall the watchdog watched (from half the threshold on).
Rules and numbers: docs/detectors.md, "Stalls".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from publisher.detectors.base import Finding
from publisher.detectors.episodes import EpisodeTracker
from publisher.wire.protocol import SEVERITIES
from publisher.wire.stall import BUSY, STUCK, WAITING, Stall

#: An observation count no stall reaches: this stall's episodes close only when steps resume.
_NEVER = 1 << 62

_KINDS = {STUCK: "hang", WAITING: "collective_wait", BUSY: "busy_pause"}

_CAUSES = {
    "hang": [
        "data loading blocked: a DataLoader worker died or waits on storage or the network "
        "(set the DataLoader's timeout)",
        "a lock, a queue or a thread join in the training code that nothing releases",
        "a network or file call without a timeout (a download, a shared file system)",
        "in a job of several ranks: a condition that lets this rank skip or delay a collective "
        "the others already entered",
    ],
    "collective_wait": [
        "another rank is late, stuck or gone: its own events (hang, busy_pause) or the relay's "
        "name it",
        "ranks call different collectives or in a different order",
        "a network or NCCL failure between the nodes",
    ],
    "busy_pause": [
        "periodic work inside the loop: evaluation, a checkpoint, logging (expected if periodic)",
        "compilation or autotuning (torch.compile recompiling for new shapes, cudnn.benchmark)",
        "a loop in the training code that does not end",
    ],
}


class StallEvents:
    """Turns the watchdog's verdicts into events (a :class:`~publisher.threads.watchdog.StallListener`).

    ``tracker``: the episodes of the Monitor's detectors; ``current_step`` reads the latest step
    the training finished. Called from the watchdog's thread only.
    """

    def __init__(self, tracker: EpisodeTracker, *, rank: int, world_size: int,
                 current_step: Callable[[], int]) -> None:
        self._tracker = tracker
        self._rank = rank
        self._world_size = world_size
        self._current_step = current_step
        #: The longest pause watched so far (seconds), which a busy one is measured against.
        self.longest_pause_s = 0.0
        self._stall = 0  # the current stall's number: each stall is an episode of its own
        #: This stall's kinds: the latest verdict, its severity, and how often each place was seen.
        self._open: dict[str, tuple[Stall, str, Counter[str | None]]] = {}
        self._state: str | None = None  # this stall's state as reported
        self._changing: str | None = None  # a new state seen once, not yet reported

    def stalled(self, stall: Stall) -> None:
        """A verdict past the threshold. The first one counts at once; a change of state counts
        once two looks in a row agree, so that a thread leaving its stall (moving, not yet at the
        next step) is not reported as a new state in the instant before the stall ends."""
        if self._state not in (None, stall.state) and self._changing != stall.state:
            self._changing = stall.state
            return
        self._state, self._changing = stall.state, None
        severity = stall.severity(self.longest_pause_s)
        kind = _KINDS.get(stall.state)
        if severity is None or kind is None:
            return
        opened = self._open.get(kind)
        places = opened[2] if opened is not None else Counter()
        places[stall.where] += 1
        if opened is not None and SEVERITIES.index(opened[1]) > SEVERITIES.index(severity):
            severity = opened[1]  # an episode never calms down while it lasts
        self._open[kind] = (stall, severity, places)
        if opened is not None and kind == "collective_wait":
            # Said when it starts and when it ends, not every 2 s between: in a job of thousands of
            # ranks, every waiting rank's updates would reach the root together while it waits.
            return
        finding = self._finding(kind, stall, severity)
        self._tracker.observe(self, self._current_step() or None, [finding], _NEVER)

    def resumed(self, length_s: float) -> None:
        """Steps resumed: close this stall's episodes with its length, remember the pause. The last
        update names the place seen most often (a thread on its way out of a stall has moved)."""
        if self._open:
            step = self._current_step() or None
            finals = [
                self._finding(kind, replace(last, where=places.most_common(1)[0][0], stalled_s=length_s),
                              severity, length_s)
                for kind, (last, severity, places) in self._open.items()
            ]
            self._tracker.observe(self, step, finals, _NEVER)
            self._tracker.observe(self, step, [], 1)
            self._open = {}
        self._state = self._changing = None
        self._stall += 1
        self.longest_pause_s = max(self.longest_pause_s, length_s)

    def _finding(self, kind: str, stall: Stall, severity: str, resumed_s: float | None = None) -> Finding:
        message = self._message(kind, stall, severity)
        details: dict[str, Any] = {
            "state": stall.state,
            "stalled_s": round(stall.stalled_s, 1),
            "threshold_s": round(stall.threshold_s, 1),
            "where": stall.where,
            "innermost": stall.innermost,
            "in_collective": stall.in_collective,
            "cpu_share": stall.cpu_share,
            "io_bytes_per_s": stall.io_bytes_per_s,
            "same_place": stall.same_place,
            "longest_pause_s": round(self.longest_pause_s, 1),
            "rank": self._rank,
            "world_size": self._world_size,
            "step": self._current_step(),
            "stack": list(stall.stack),
            "likely_causes": _CAUSES[kind],
        }
        if resumed_s is not None:
            message = f"{message}; steps resumed after {resumed_s:.1f} s"
            details |= {"resumed": True, "paused_s": round(resumed_s, 1)}
        return Finding(kind, message, details, severity=severity, key=self._stall)

    def _message(self, kind: str, stall: Stall, severity: str) -> str:
        who = f"rank {self._rank}" if self._world_size > 1 else "training"
        seconds = f"{stall.stalled_s:.0f} s"
        place = f" in {stall.where}" if stall.where else ""
        inner = (f", innermost frame {stall.innermost}"
                 if stall.innermost and stall.innermost != stall.where else "")
        if kind == "hang":
            used = _usage(stall)
            text = f"{who} stuck for {seconds}{place}: blocked ({used}){inner}"
            if self._world_size > 1:
                text += (f"; rank {self._rank} is outside any collective, so the other ranks wait "
                         "for it in their next one")
            return text
        if kind == "collective_wait":
            called = f", called from {stall.where}" if stall.where else ""
            collective = f" ({stall.innermost}{called})" if stall.innermost else ""
            return (f"{who} waits {seconds} in a collective{collective}: another rank has not joined "
                    "it; this rank is not stuck itself")
        longest = self.longest_pause_s
        if severity == "warning":
            return (f"{who} busy for {seconds}{place}, far beyond any earlier pause "
                    f"({longest:.0f} s): a loop that does not end?")
        earlier = f"longest earlier pause {longest:.0f} s" if longest else "the first pause of the run"
        return f"{who} paused for {seconds}, busy{place} ({_usage(stall)}): {earlier}"


def _usage(stall: Stall) -> str:
    """``3% CPU, no I/O``: what the thread used, as far as it is known."""
    parts = []
    if stall.cpu_share is not None:
        parts.append(f"{stall.cpu_share:.0%} CPU")
    if stall.io_bytes_per_s is not None:
        io = stall.io_bytes_per_s
        parts.append("no I/O" if io < 1024 else f"{io / 1024 / 1024:.1f} MiB/s I/O")
    if stall.same_place is not None:
        parts.append("in one place" if stall.same_place else "moving")
    return ", ".join(parts) or "no CPU or I/O figures"
