"""Episodes: a finding that repeats step after step is ONE event, updated at a bounded rate.

Every source of findings (the detectors, the training invariants) would otherwise redo this: a
finding that repeats is announced once as an ``event`` and then re-sent with the same ``id`` and
a higher ``count`` at most every ``min_update_s``; the episode ends after ``quiet_to_close``
observations without a finding, and a later finding opens a new one. Folding repeats this way is
what keeps a NaN that persists for 10,000 steps from becoming 10,000 events.

An update keeps what set the episode off: its ``message`` and ``details`` are the first finding's
(the ``inf`` loss that points to a ``log(0)``, not the ``nan`` that followed), and the latest
finding travels beside them as ``latest`` (its step, message and value), shown as an update.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from publisher.detectors.base import Finding
from publisher.wire.jsonsafe import json_safe
from publisher.wire.protocol import SEVERITIES, latest_update


@dataclass(slots=True)
class _Episode:
    id: str
    kind: str
    severity: str
    first_step: int | None
    last_step: int | None
    message: str
    details: dict[str, Any]
    #: The latest finding's message, value and details, once the episode has repeated.
    latest_message: str | None = None
    latest_value: Any = None
    latest_details: dict[str, Any] | None = None
    count: int = 1
    sent_count: int = 0
    sent_at: float = 0.0
    quiet: int = 0


#: Emits one event body: ``emit(step, body)`` where body has id, severity, kind, message,
#: details, count (the Monitor hands it to ``Publisher.publish("event", step=step, **body)``).
EmitEvent = Callable[[int | None, dict[str, Any]], None]

_SEVERITY_RANK = {name: i for i, name in enumerate(SEVERITIES)}


class EpisodeTracker:
    """Folds repeated findings into episodes: one event per episode, updates rate-limited.

    Episodes belong to an owner (a detector): only that owner's observations age them, so a GPU
    detector sampled once a second and a loss detector called 1000 times a second each end their
    episodes after their own ``quiet_to_close`` observations. Each owner is observed from one
    thread (the training loop or the GPU sampler), so the per-owner state needs no lock.
    """

    def __init__(self, emit: EmitEvent, *, rank: int = 0, min_update_s: float = 2.0,
                 id_prefix: str = "") -> None:
        self.rank = rank
        self._id_prefix = id_prefix
        self.min_update_s = min_update_s
        self._emit = emit
        self._ids = itertools.count()
        self._open: dict[int, dict[tuple[str, Any], _Episode]] = {}
        #: ``id(owner)`` of the owners that ever had an episode (a cheap test for callers).
        self.open_owners = self._open

    def new_id(self) -> str:
        """A fresh event id, unique within the run: ``"<rank>-<prefix><n>"`` (a tracker in another
        process of the rank has a prefix of its own)."""
        return f"{self.rank}-{self._id_prefix}{next(self._ids)}"

    def observe(
        self, owner: object, step: int | None, findings: Sequence[Finding], quiet_to_close: int
    ) -> None:
        """Record one observation of ``owner`` and the findings it produced (maybe none)."""
        episodes = self._open.get(id(owner))
        if not findings and not episodes:
            return  # the common case, every step on the step worker: nothing open, nothing new
        if episodes is None:
            episodes = self._open[id(owner)] = {}
        seen = set()
        now = 0.0
        for finding in findings:
            now = now or time.monotonic()
            key = (finding.kind, finding.key)
            seen.add(key)
            episode = episodes.get(key)
            if episode is None:
                episodes[key] = episode = _Episode(
                    id=self.new_id(),
                    kind=finding.kind,
                    severity=finding.resolved_severity(),
                    first_step=step,
                    last_step=step,
                    message=finding.message,
                    details=finding.details,
                )
                self._send(episode, now)
                continue
            episode.count += 1
            episode.quiet = 0
            episode.last_step = step
            episode.latest_message = finding.message
            episode.latest_value = finding.details.get("value")
            episode.latest_details = finding.details
            severity = finding.resolved_severity()
            escalated = _SEVERITY_RANK[severity] > _SEVERITY_RANK[episode.severity]
            if escalated:
                episode.severity = severity
            if escalated or now - episode.sent_at >= self.min_update_s:
                self._send(episode, now)
        if len(seen) == len(episodes):
            return
        for key in [k for k in episodes if k not in seen]:
            episode = episodes[key]
            episode.quiet += 1
            if episode.quiet >= quiet_to_close:
                del episodes[key]
                if episode.count > episode.sent_count:
                    self._send(episode, time.monotonic())

    def flush(self) -> None:
        """Send the last count of every episode whose latest repeats were held back (at close)."""
        now = time.monotonic()
        for episodes in self._open.values():
            for episode in episodes.values():
                if episode.count > episode.sent_count:
                    self._send(episode, now)

    def _send(self, episode: _Episode, now: float) -> None:
        episode.sent_count = episode.count
        episode.sent_at = now
        details = dict(episode.details, first_step=episode.first_step, last_step=episode.last_step)
        body = {
            "id": episode.id,
            "severity": episode.severity,
            "kind": episode.kind,
            "message": episode.message,
            "details": json_safe(details),
            "count": episode.count,
        }
        if episode.latest_message is not None:
            body["latest"] = json_safe(latest_update(episode.last_step, episode.latest_message,
                                                     episode.latest_value, episode.latest_details,
                                                     episode.details))
        self._emit(episode.first_step, body)
