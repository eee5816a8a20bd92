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
from types import UnionType
from typing import Any

import orjson

PROTOCOL_VERSION = 1

#: Larger messages are refused by the viewer (counted and skipped). The largest legitimate
#: message is a ``gpu`` message for a big node or an ``event`` with rich details: far below this.
MAX_MESSAGE_BYTES = 1 << 20

MESSAGE_TYPES = frozenset(
    {"run_start", "metrics", "gpu", "event", "invariant", "heartbeat", "run_end"}
)
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


#: Why a frame was refused, as counted on the viewer's status line.
REASONS = ("oversized", "not JSON", "not an object", "wrong version", "unknown type", "invalid field")


class ProtocolError(ValueError):
    """A message that is not valid tuimon protocol: the viewer counts it (by ``reason``) and skips it."""

    def __init__(self, message: str, reason: str = "invalid field") -> None:
        super().__init__(message)
        self.reason = reason


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


def encode(message: Mapping[str, Any]) -> bytes:
    """Serialise one message to its single-frame wire form (compact UTF-8 JSON).

    Bodies are made wire-safe before they get here (:func:`wire_numbers`, ``json_safe``); a
    stray NaN would be written as ``null`` by orjson, never as invalid JSON. Keys that are not
    strings raise ``TypeError``.
    """
    return orjson.dumps(message)


def _require(message: Mapping[str, Any], field: str, kind: type | UnionType | tuple[type, ...]) -> Any:
    value = message.get(field)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ProtocolError(f"field {field!r} missing or not {getattr(kind, '__name__', kind)}")
    return value


def _check_body(message: Mapping[str, Any]) -> None:
    """Type-specific checks: only what the viewer relies on, so that additions stay compatible."""
    msg_type = message["type"]
    if msg_type == "metrics":
        _require(message, "step", int)
        values = _require(message, "metrics", dict)
        for name, value in values.items():
            try:
                read_number(value)
            except ProtocolError as exc:
                raise ProtocolError(f"metric {name!r}: {exc}") from None
    elif msg_type == "gpu":
        devices = _require(message, "devices", list)
        for device in devices:
            if not isinstance(device, dict) or not isinstance(device.get("index"), int):
                raise ProtocolError("each gpu device needs an integer 'index'")
    elif msg_type == "event":
        if message.get("severity") not in SEVERITIES:
            raise ProtocolError(f"event severity must be one of {SEVERITIES}")
        _require(message, "kind", str)
        _require(message, "message", str)
    elif msg_type == "invariant":
        _require(message, "name", str)
        if message.get("status") not in INVARIANT_STATUSES:
            raise ProtocolError(f"invariant status must be one of {INVARIANT_STATUSES}")
    elif msg_type == "run_end" and message.get("status") not in RUN_END_STATUSES:
        raise ProtocolError(f"run_end status must be one of {RUN_END_STATUSES}")


def decode(frame: bytes | str) -> dict[str, Any]:
    """Parse and validate one wire message. Raises :class:`ProtocolError` on anything wrong.

    Size is checked before parsing so an oversized frame costs nothing to refuse.
    """
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds {MAX_MESSAGE_BYTES}", "oversized")
    try:
        # orjson refuses bare NaN and nesting deeper than 1024 (a frame of "[[[[..." costs nothing).
        message = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}", "not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object", "not an object")
    version = message.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {PROTOCOL_VERSION}", "wrong version")
    if message.get("type") not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {message.get('type')!r}", "unknown type")
    _require(message, "run", str)
    _require(message, "rank", int)
    _require(message, "host", str)
    _require(message, "ts", int | float)
    _require(message, "seq", int)
    if "step" in message and not isinstance(message["step"], int):
        raise ProtocolError("field 'step' is not an integer")
    _check_body(message)
    return message
