"""One alert as every channel receives it: a title and a line for people, and the event's fields.

Webhooks and commands get the same JSON object: ``text`` (title and line, escaped for Slack) then
the event's fields as they came on the wire (:data:`EVENT_FIELDS`: ``run``, ``rank``, ``host``,
``id``, ``step``, ``severity``, ``kind``, ``message``, ``details``, ...). That is the body of a Slack
incoming webhook (https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks/: a
JSON object whose ``text`` is the message), and of the Slack-compatible ones of Mattermost,
Rocket.Chat and others, while a script reads the fields. What a peer sends is not trusted here:
only the protocol's event fields are copied (a peer's extra ``blocks`` or ``channel`` would be read
by Slack), and ``&``, ``<`` and ``>`` are escaped in ``text`` as Slack asks ("Escaping text" in its
formatting docs), so an event's message cannot ``<!channel>`` a whole channel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire.protocol import ENVELOPE_FIELDS, encode, update_words

#: The fields of an event message an alert carries (docs/protocol.md, "event"; ``by``: a relay's).
EVENT_FIELDS = (*ENVELOPE_FIELDS, "step", "id", "severity", "kind", "message", "details", "count", "latest",
                "by")
#: The ``type`` of the alert that sums up what the rate limit held back.
SUPPRESSED_TYPE = "alerts_suppressed"


@dataclass(frozen=True)
class Alert:
    """``title`` and ``text`` are plain (a desktop notification shows them); :meth:`body` is the JSON."""

    title: str
    text: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> bytes:
        """The JSON object webhooks and commands receive (compact UTF-8, the protocol's encoder)."""
        body: dict[str, Any] = {"text": slack_escape(f"{self.title}: {self.text}")}
        body.update(self.fields)
        return encode(body)


def event_alert(event: Mapping[str, Any]) -> Alert:
    """The alert for one ``event`` message (validated by the receiver, so its fields are there)."""
    where = f"run {event['run']}, rank {event['rank']} on {event['host']}"
    if isinstance(event.get("step"), int):
        where += f", step {event['step']}"
    fields = {key: event[key] for key in EVENT_FIELDS if key in event}
    title = f"tuimon: {event['severity'].upper()} {event['kind']}"
    update = update_words(event.get("count", 1), event.get("latest"))
    return Alert(title, f"{event['message']} ({where})" + (f"; {update}" if update else ""), fields)


def suppressed_alert(kinds: Counter[str], per_minute: int) -> Alert:
    """The alert after a burst: how many the rate limit held back, by kind."""
    total = sum(kinds.values())
    by_kind = ", ".join(f"{kind} ×{count}" for kind, count in kinds.most_common())
    plural = "s" if total != 1 else ""
    text = f"{total} more alert{plural} suppressed (at most {per_minute} a minute): {by_kind}"
    fields = {"type": SUPPRESSED_TYPE, "count": total, "kinds": dict(kinds)}
    return Alert("tuimon: alerts suppressed", text, fields)


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
