"""Which events become alerts: at or above the chosen severity, once an episode, a few a minute.

A detector's episode is one ``id`` re-sent with a higher ``count`` while it lasts
(docs/protocol.md, "event"), so an alert is keyed by (run, id): the first update heard at or above
the level alerts, the later ones do not. Episodes a viewer learns from a snapshot that began
before it started are :meth:`AlertPolicy.remember`-ed, never alerted: a phone should not ring for
every old event of a run each time someone opens a dashboard.

A run going wrong sends many events at once (every rank's NaN), so alerts are rate limited: at
most ``per_minute`` in any 60 s (a sliding window). Beyond it they are counted by kind, and once
the window has room again one alert sums them up ("k more alerts suppressed"); until it is sent,
newer events join the count, so the summary always comes before what follows the burst.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from typing import Any

from tuimon.notify.settings import SEVERITY_RANK

#: Seconds of the rate limit's window.
WINDOW_S = 60.0
#: Episodes remembered (the oldest are forgotten first), bounded whatever peers send.
MAX_EPISODES = 100_000


class Verdict(enum.Enum):
    SKIP = "skip"  # below the level, or an episode already alerted (or known from a snapshot)
    SEND = "send"
    SUPPRESSED = "suppressed"  # over the rate limit: counted for the summary


class AlertPolicy:
    """The decisions, with no threads or clocks of its own (callers hold a lock and pass ``now``)."""

    def __init__(self, level: str, per_minute: int) -> None:
        self.level = SEVERITY_RANK[level]
        self.per_minute = per_minute
        self._episodes: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._sent: deque[float] = deque(maxlen=per_minute)  # when the latest alerts went
        self.suppressed: Counter[str] = Counter()  # by kind, waiting for the summary
        self.suppressed_total = 0

    def remember(self, event: Mapping[str, Any]) -> None:
        """An event from before joining: its episode never alerts (if it is at the level already)."""
        if self._at_level(event):
            self._mark(episode_key(event))

    def admit(self, event: Mapping[str, Any], now: float) -> Verdict:
        """What to do with a live event heard at ``now`` (seconds, any monotonic clock)."""
        key = episode_key(event)
        if not self._at_level(event) or key in self._episodes:
            return Verdict.SKIP
        self._mark(key)
        if not self.suppressed and self._has_room(now):
            self._sent.append(now)
            return Verdict.SEND
        self.suppressed[event["kind"]] += 1
        self.suppressed_total += 1
        return Verdict.SUPPRESSED

    def take_suppressed(self, now: float) -> Counter[str] | None:
        """What the summary alert is to say, by kind, once the window has room for it (None: not
        yet, or nothing was suppressed); the summary takes its place in the window."""
        if not self.suppressed or not self._has_room(now):
            return None
        self._sent.append(now)
        taken, self.suppressed = self.suppressed, Counter()
        return taken

    def _at_level(self, event: Mapping[str, Any]) -> bool:
        return SEVERITY_RANK.get(event["severity"], 0) >= self.level

    def _has_room(self, now: float) -> bool:
        return len(self._sent) < self.per_minute or now - self._sent[0] >= WINDOW_S

    def _mark(self, key: tuple[str, str]) -> None:
        self._episodes[key] = None
        if len(self._episodes) > MAX_EPISODES:
            self._episodes.popitem(last=False)


def episode_key(event: Mapping[str, Any]) -> tuple[str, str]:
    """(run, episode id): ids are unique within a run; one without an id is its own episode, named
    as the store names it (rank and ``seq``)."""
    return event["run"], str(event.get("id") or f"{event['rank']}-{event['seq']}")
