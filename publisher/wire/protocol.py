"""The tuimon wire protocol: single-frame JSON messages, versioned.

This module is the one place that knows the message shapes. The publisher builds messages
with :func:`make_message`, the viewer checks them with :func:`decode`; recordings are the same
bytes, one message a line. It depends only on orjson (a fast, strict JSON codec: ~1 µs to
parse a metrics message against ~4.5 µs for the standard library, which set the viewer's
ingest ceiling) so both sides and other tools can import it without torch or textual. The
human-readable contract is ``docs/protocol.md``; change either only together, and bump
:data:`PROTOCOL_VERSION` when a change would break a reader.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from publisher.wire.validation import MAX_FRAME_BYTES, REASONS, ProtocolError, check_message

__all__ = [
    "MAX_MESSAGE_BYTES", "MESSAGE_TYPES", "PROTOCOL_VERSION", "REASONS", "SNAPSHOT_REQUEST", "ProtocolError",
    "decode", "encode", "encode_fitted", "make_message", "numbered_by_sender", "read_number", "wire_number",
    "wire_numbers",
]

PROTOCOL_VERSION = 1

#: Larger frames are refused before they are parsed (counted and skipped); each type has its
#: own, smaller bound (:data:`~publisher.wire.validation.MAX_FRAME_BYTES`), this is the largest.
MAX_MESSAGE_BYTES = 1 << 20

MESSAGE_TYPES = frozenset(
    {"run_start", "metrics", "gpu", "event", "invariant", "heartbeat", "run_end", "relay", "summary"}
)
#: Types a relay makes itself: numbered by the relay, not by the rank their envelope names.
RELAY_TYPES = frozenset({"relay", "summary"})
#: Seconds between two updates of a relay's finding that lasts (a higher ``count``, same ``id``):
#: a reader can tell a current finding from one that is over.
RELAY_REPEAT_S = 5.0
SEVERITIES = ("info", "warning", "critical")
INVARIANT_STATUSES = ("ok", "violated", "unchecked")
RUN_END_STATUSES = ("completed", "failed", "interrupted")

#: Envelope fields every message carries.
ENVELOPE_FIELDS = ("v", "type", "run", "rank", "host", "ts", "seq")

#: Snapshot exchange (late joiners), on the publisher's ROUTER socket whose address every
#: heartbeat advertises in ``"snapshot"``. The viewer sends one frame ``SNAPSHOT_REQUEST``
#: from a DEALER; the reply is one multipart message: a header frame
#: ``{"v": 1, "type": "snapshot", "seq": <last seq included>, "count": n}`` followed by n frames,
#: each an ordinary wire message, in ``seq`` order.
SNAPSHOT_REQUEST = b'{"v": 1, "type": "snapshot_request"}'

# Non-finite floats are not JSON. On the wire they are these strings, so that any JSON reader
# (jq, a browser) can read a recording of a run whose loss went NaN.
_NONFINITE_TO_WIRE = {"nan": "nan", "inf": "inf", "-inf": "-inf"}
_WIRE_TO_FLOAT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def wire_number(value: float | int | None) -> float | int | str | None:
    """Turn a number into its wire form: finite numbers as they are, NaN/Inf as strings."""
    if value is None or isinstance(value, int):
        return value
    value = float(value)
    if math.isfinite(value):
        return value
    return _NONFINITE_TO_WIRE[repr(value)]


def read_number(value: Any) -> float | None:
    """The inverse of :func:`wire_number`: a float (possibly NaN/Inf) or None if absent.

    Raises :class:`ProtocolError` for anything that is not a number or a non-finite marker.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in _WIRE_TO_FLOAT:
        return _WIRE_TO_FLOAT[value]
    raise ProtocolError(f"expected a number, got {value!r}")


def wire_numbers(values: Mapping[str, float | int | None]) -> dict[str, float | int | str | None]:
    """Wire form of a name → number mapping (a metrics dict)."""
    return {name: wire_number(v) for name, v in values.items()}


def make_message(
    msg_type: str,
    *,
    run: str,
    rank: int,
    host: str,
    ts: float,
    seq: int,
    step: int | None = None,
    **body: Any,
) -> dict[str, Any]:
    """Build a message dict with the envelope first. ``body`` must already be JSON-safe.

    ``body`` may not carry ``v`` or ``type``: they would silently overwrite the envelope and the
    message would lie about its version or kind (the other envelope fields are parameters, so
    Python already refuses them twice).
    """
    if msg_type not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {msg_type!r}")
    if "v" in body or "type" in body:
        raise ValueError("a message body may not set the envelope fields 'v' or 'type'")
    message: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "type": msg_type,
        "run": run,
        "rank": rank,
        "host": host,
        "ts": ts,
        "seq": seq,
    }
    if step is not None:
        message["step"] = step
    message.update(body)
    return message


def latest_update(step: int | None, message: str, value: Any = None,
                  details: Mapping[str, Any] | None = None,
                  first_details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An event update's ``latest`` field: the episode's latest finding (its step, its message, its
    value where it has one, and those of its ``details`` that differ from ``first_details``, the
    first finding's, such as a stall's ``resumed``), sent beside the first finding's ``message`` and
    ``details``, which say what set the episode off."""
    latest: dict[str, Any] = {"step": step, "message": message}
    if isinstance(value, int | float) and not isinstance(value, bool):
        latest["value"] = wire_number(value)
    first = first_details or {}
    changed = {key: item for key, item in (details or {}).items() if key not in first or first[key] != item}
    if changed:
        latest["details"] = changed
    return latest


def fold_event_update(first_message: str, first_details: Mapping[str, Any],
                      update: Mapping[str, Any]) -> Mapping[str, Any]:
    """An episode's ``update`` as readers keep it, given what they heard first of it: an update
    with ``latest`` already carries what set the episode off; one from a publisher older than that
    field carries the latest repeat's message and details, which become its ``latest``."""
    if "latest" in update or update["message"] == first_message:
        return update
    details = update.get("details")
    last_step = details.get("last_step") if isinstance(details, dict) else None
    latest = latest_update(last_step if isinstance(last_step, int) else None, update["message"])
    return {**update, "message": first_message, "details": first_details, "latest": latest}


def update_words(count: int, latest: Mapping[str, Any] | None) -> str:
    """``×200, latest at step 601: loss 1.28 …``: an event's repeats since it fired, in words, from
    its ``count`` and ``latest`` field ("" while it has not repeated)."""
    if not latest or not isinstance(latest.get("message"), str):
        return ""
    step = latest.get("step")
    at = f" at step {step:,}" if isinstance(step, int) else ""
    return f"×{count}, latest{at}: {latest['message']}"


def numbered_by_sender(message: Mapping[str, Any]) -> bool:
    """Whether ``seq`` numbers the stream of the (run, rank) in the envelope: false for what a relay
    made (its beats, node summaries, and findings about a rank, which carry ``by``), so readers
    keep those out of a rank's gap counting and snapshot joining."""
    return message["type"] not in RELAY_TYPES and "by" not in message


def encode(message: Mapping[str, Any]) -> bytes:
    """Serialise one message to its single-frame wire form (compact UTF-8 JSON).

    Bodies are made wire-safe before they get here (:func:`wire_numbers`, ``json_safe``); a
    stray NaN would be written as ``null`` by orjson, never as invalid JSON. Keys that are not
    strings raise ``TypeError``.
    """
    return orjson.dumps(message)


def decode(frame: bytes | str) -> dict[str, Any]:
    """Parse and validate one wire message (:mod:`publisher.wire.validation`); raises
    :class:`ProtocolError` on anything wrong, and nothing else, whatever the frame holds.

    Size is checked before parsing so an oversized frame costs nothing to refuse.
    """
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds {MAX_MESSAGE_BYTES}", "oversized")
    try:
        # orjson refuses bare NaN, numbers beyond 64 bits or a double's range, and nesting deeper
        # than 1024 (a frame of "[[[[..." costs nothing).
        message = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}", "not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object", "not an object")
    version = message.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        problem = f"protocol version {_quote(version)}, expected {PROTOCOL_VERSION}"
        raise ProtocolError(problem, "wrong version")
    msg_type = message.get("type")
    if not isinstance(msg_type, str) or msg_type not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {_quote(msg_type)}", "unknown type")
    if len(frame) > MAX_FRAME_BYTES[msg_type]:
        raise ProtocolError(
            f"{msg_type} message of {len(frame):,} bytes exceeds {MAX_FRAME_BYTES[msg_type]:,}", "oversized"
        )
    check_message(message)
    return message


#: Free-form fields replaced by a note when a message is over its type's size bound.
_SHRINKABLE = ("details", "layers", "config", "repro", "versions")


def encode_fitted(message: dict[str, Any]) -> bytes:
    """:func:`encode`, and a message over its type's size bound (:data:`MAX_FRAME_BYTES`, which
    readers enforce) made to fit: its free-form parts (event details, a config, a per-layer
    sample) are replaced by a note saying so, so that readers still get the rest. ValueError if
    that is not enough. What publishers send goes through here."""
    frame = encode(message)
    limit = MAX_FRAME_BYTES[message["type"]]
    if len(frame) <= limit:
        return frame
    for field in _SHRINKABLE:
        if field in message:
            message[field] = {"…": f"left out: the message was {len(frame):,} bytes, over {limit:,}"}
    fitted = encode(message)
    if len(fitted) > limit:
        raise ValueError(f"{message['type']} message of {len(fitted):,} bytes, over {limit:,}")
    return fitted


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
