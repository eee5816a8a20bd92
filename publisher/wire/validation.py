"""The protocol's shapes and bounds, checked for every message when it is decoded, in this one place.

A viewer, a relay or a recording reader trusts nothing it receives: any user of the node can
connect to a publisher's port or a viewer's, and a recording can be edited by hand. Everything a
reader relies on is checked here, once, before the message reaches a store or a widget: the
type of every known field, numbers finite or written as the protocol's ``"nan"``/``"inf"``
markers, integers within 64 bits, strings and collections within bounds, free-form objects
(configs, event details) within a nesting depth and a size. A message that breaks a rule raises
:class:`~publisher.wire.protocol.ProtocolError` with a reason (counted on the viewer's status
line) and a message naming the field; the reader skips that message alone.

The bounds are far above what a real run sends (the largest legitimate message, a ``gpu``
message of a big node or an event with rich details, is a few kilobytes) and low enough that
nothing a peer sends can make the viewer's memory grow or its screen stall. The publisher makes
users' values fit them on the way in (:mod:`publisher.wire.jsonsafe`), so a run's own messages
are never refused. Unknown fields are not checked (readers ignore them: the protocol can grow);
the frame's size cap (:data:`~publisher.wire.protocol.MAX_MESSAGE_BYTES`) bounds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from math import isfinite
from typing import Any

#: Characters in a name: run, host, metric, event kind and id, invariant, GPU name.
MAX_NAME_CHARS = 256
#: Characters in a free text: an event's message, an error, a string inside details or a config.
MAX_TEXT_CHARS = 16_384
#: Nesting of free-form objects (config, details, repro, layers): deeper is refused.
MAX_DEPTH = 20
#: Values (leaves and containers) in one free-form object.
MAX_NODES = 20_000
#: Metric names in one ``metrics`` message.
MAX_METRICS = 1_024
#: Devices in one ``gpu`` message.
MAX_DEVICES = 256
#: Items in a list field (argv, a device's throttle reasons).
MAX_LIST_ITEMS = 4_096
#: The largest integer a counter or step may hold (signed 64 bits: what every reader can store).
MAX_INT = 2**63 - 1
#: Bytes of one frame, by message type. What a viewer keeps of each type (10,000 events a run,
#: the latest run_start) is bounded by these: events and invariants are read by people (a few
#: kilobytes in practice), a ``metrics`` message may carry a per-layer sample (about 50 KB for
#: 256 parameters), ``run_start`` a large config. The publisher makes its own messages fit
#: (:meth:`~publisher.wire.transport.Publisher.publish`).
MAX_FRAME_BYTES = {
    "metrics": 256 * 1024,
    "gpu": 256 * 1024,
    "event": 16 * 1024,
    "invariant": 16 * 1024,
    "heartbeat": 16 * 1024,
    "run_end": 16 * 1024,
    "run_start": 1024 * 1024,
    "relay": 64 * 1024,
    "summary": 256 * 1024,
}

#: Why a message was refused, as the viewer's status line counts them.
REASONS = (
    "oversized", "not JSON", "not an object", "wrong version", "unknown type", "invalid field",
    "out of range", "too large", "too deep",
)


class ProtocolError(ValueError):
    """A message that is not valid tuimon protocol: readers count it (by ``reason``, one of
    :data:`REASONS`) and skip it."""

    def __init__(self, message: str, reason: str = "invalid field") -> None:
        super().__init__(message)
        self.reason = reason

_MARKERS = frozenset({"nan", "inf", "-inf"})
#: GPU fields that are numbers (or null, when a device does not report them).
_GPU_NUMBERS = (
    "util", "mem_used", "mem_total", "temp_c", "power_w", "power_limit_w", "sm_clock_mhz", "ecc_errors",
)


def _error(message: str, reason: str = "invalid field") -> ProtocolError:
    return ProtocolError(message, reason)


# -- field checks ---------------------------------------------------------------------------------


def _integer(message: Mapping[str, Any], field: str, *, low: int = 0, required: bool = True) -> None:
    value = message.get(field)
    if value is None and not required and field not in message:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise _error(f"field {field!r} missing or not an integer")
    if not low <= value <= MAX_INT:
        raise _error(f"field {field!r} = {value} is outside {low}..2^63-1", "out of range")


def _string(message: Mapping[str, Any], field: str, limit: int, *, required: bool = True) -> None:
    value = message.get(field)
    if value is None and not required:
        return
    if not isinstance(value, str):
        raise _error(f"field {field!r} missing or not a string")
    if len(value) > limit:
        raise _error(f"field {field!r} has {len(value):,} characters, more than {limit:,}", "too large")


def check_number(value: Any, what: str, name: str | None = None) -> None:
    """A number as the protocol writes it: finite, a non-finite marker, or null. An error names
    ``what``, then ``name`` when given (``metric 'loss'``): the words are put together only for an
    error, since this runs for every number of every message (a viewer at 50,000 messages a second
    spent a tenth of its intake formatting names of numbers that were fine)."""
    if value is None or (isinstance(value, float) and math.isfinite(value)):
        return
    if isinstance(value, int) and not isinstance(value, bool):
        return  # orjson reads integers only within 64 bits: all of them fit a float
    if isinstance(value, str) and value in _MARKERS:
        return
    label = what if name is None else f"{what} {name!r}"
    raise _error(f"{label}: expected a number or 'nan'/'inf'/'-inf', got {_short(value)}")


def _choice(message: Mapping[str, Any], field: str, allowed: tuple[str, ...]) -> None:
    value = message.get(field)
    if not isinstance(value, str) or value not in allowed:
        raise _error(f"field {field!r} must be one of {', '.join(allowed)}, got {_short(value)}")


def check_free_form(value: Any, what: str) -> None:
    """A user-shaped object (a config, event details): JSON, nested at most :data:`MAX_DEPTH`
    deep, at most :data:`MAX_NODES` values, strings of at most :data:`MAX_TEXT_CHARS`.

    Iterative, so a deep object costs no recursion; it stops at the first bound exceeded.
    """
    nodes = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise _error(f"{what} holds more than {MAX_NODES:,} values", "too large")
        if isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise _error(f"{what} is nested deeper than {MAX_DEPTH} levels", "too deep")
            for key, child in item.items():
                if len(key) > MAX_NAME_CHARS:
                    raise _error(f"{what}: a key of {len(key):,} characters", "too large")
                pending.append((child, depth + 1))
        elif isinstance(item, list):
            if depth > MAX_DEPTH:
                raise _error(f"{what} is nested deeper than {MAX_DEPTH} levels", "too deep")
            pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            if len(item) > MAX_TEXT_CHARS:
                raise _error(f"{what}: a string of {len(item):,} characters", "too large")
        elif isinstance(item, float) and not math.isfinite(item):
            raise _error(f"{what}: a non-finite number not written as 'nan'/'inf'")


def _object(message: Mapping[str, Any], field: str, *, required: bool = False) -> None:
    value = message.get(field)
    if value is None and not required:
        return
    if not isinstance(value, dict):
        raise _error(f"field {field!r} missing or not an object")
    check_free_form(value, f"field {field!r}")


# -- per type -------------------------------------------------------------------------------------


def _metrics(message: Mapping[str, Any]) -> None:
    values = message.get("metrics")
    if not isinstance(values, dict):
        raise _error("field 'metrics' missing or not an object")
    if len(values) > MAX_METRICS:
        raise _error(f"{len(values):,} metrics in one message, more than {MAX_METRICS:,}", "too large")
    for name, value in values.items():
        if len(name) > MAX_NAME_CHARS:
            raise _error(f"a metric name of {len(name):,} characters", "too large")
        if value.__class__ is not float or not isfinite(value):  # a finite float costs no call
            check_number(value, "metric", name)
    if "layers" in message:
        _object(message, "layers")
    if "failed" in message:
        failed = message["failed"]
        if (not isinstance(failed, list) or len(failed) > MAX_METRICS
                or not all(isinstance(part, str) and len(part) <= MAX_NAME_CHARS for part in failed)):
            raise _error(f"field 'failed' must be a list of at most {MAX_METRICS:,} part names")


def _gpu(message: Mapping[str, Any]) -> None:
    devices = message.get("devices")
    if not isinstance(devices, list):
        raise _error("field 'devices' missing or not a list")
    if len(devices) > MAX_DEVICES:
        raise _error(f"{len(devices):,} devices in one message, more than {MAX_DEVICES}", "too large")
    for device in devices:
        if not isinstance(device, dict):
            raise _error("each gpu device must be an object")
        _integer(device, "index")
        for field in _GPU_NUMBERS:
            check_number(device.get(field), "gpu field", field)
        _string(device, "name", MAX_NAME_CHARS, required=False)
        _string(device, "uuid", MAX_NAME_CHARS, required=False)
        throttle = device.get("throttle")
        if throttle is not None and not (
            isinstance(throttle, list)
            and len(throttle) <= 64
            and all(isinstance(reason, str) and len(reason) <= MAX_NAME_CHARS for reason in throttle)
        ):
            raise _error("gpu field 'throttle' must be a short list of reason names")


def _event(message: Mapping[str, Any]) -> None:
    _choice(message, "severity", ("info", "warning", "critical"))
    _string(message, "kind", MAX_NAME_CHARS)
    _string(message, "message", MAX_TEXT_CHARS)
    _string(message, "id", MAX_NAME_CHARS, required=False)
    _integer(message, "count", required=False)
    _object(message, "details")
    latest = message.get("latest")
    if latest is not None:
        if not isinstance(latest, dict):
            raise _error("event field 'latest' must be an object")
        _string(latest, "message", MAX_TEXT_CHARS)
        if latest.get("step") is not None:
            _integer(latest, "step")
        _object(latest, "details")


def _invariant(message: Mapping[str, Any]) -> None:
    _string(message, "name", MAX_NAME_CHARS)
    _choice(message, "status", ("ok", "violated", "unchecked"))
    _string(message, "message", MAX_TEXT_CHARS, required=False)
    _object(message, "details")


#: Entries in a heartbeat's ``stack`` (the training thread's Python stack while it is stalled, one
#: "file:line function" each, innermost last) and characters in one entry. Publishers send fewer
#: and shorter ones (:mod:`publisher.threads.stacks`); the frame's 16 KiB bound holds in any case.
MAX_STACK_FRAMES = 64
MAX_STACK_ENTRY_CHARS = 512


def _heartbeat(message: Mapping[str, Any]) -> None:
    _string(message, "snapshot", MAX_NAME_CHARS, required=False)
    _object(message, "stats")
    _watchdog_fields(message, "stalled_s")


def _watchdog_fields(fields: Mapping[str, Any], seconds: str) -> None:
    """What a heartbeat says of the training thread (seconds stalled or silent, its threshold, its
    stack, whether it is inside a collective, its CPU share, I/O rate and whether it moved:
    :data:`publisher.wire.stall.BEAT_FIELDS`), in a heartbeat or in a summary's ``beats``."""
    stalled = fields.get(seconds)
    if stalled is not None and (
        isinstance(stalled, bool) or not isinstance(stalled, int | float) or not 0 <= stalled < math.inf
    ):
        raise _error(f"field {seconds!r} must be a finite number of seconds, not negative")
    stack = fields.get("stack")
    if stack is not None:
        if not isinstance(stack, list) or not all(isinstance(item, str) for item in stack[:MAX_STACK_FRAMES]):
            raise _error("field 'stack' must be a list of strings")
        if len(stack) > MAX_STACK_FRAMES or any(len(entry) > MAX_STACK_ENTRY_CHARS for entry in stack):
            raise _error(
                f"field 'stack' must hold at most {MAX_STACK_FRAMES} entries of at most "
                f"{MAX_STACK_ENTRY_CHARS} characters", "too large",
            )
    for name in ("in_collective", "same_place"):
        flag = fields.get(name)
        if flag is not None and not isinstance(flag, bool):
            raise _error(f"field {name!r} must be true, false or null")
    for name, top in (("stall_after_s", math.inf), ("io_bytes_per_s", math.inf), ("workers_cpu", math.inf),
                      ("cpu_share", 1.0)):
        value = fields.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top
            or not math.isfinite(value)
        ):
            raise _error(f"field {name!r} must be a finite number from 0 to {top}")


def _relay(message: Mapping[str, Any]) -> None:
    _choice(message, "role", ("root", "node"))
    _string(message, "listen", MAX_NAME_CHARS)
    _string(message, "snapshot", MAX_NAME_CHARS, required=False)
    _string(message, "upstream", MAX_NAME_CHARS, required=False)
    _integer(message, "publishers")
    ranks = message.get("ranks")
    if ranks is not None:
        if not isinstance(ranks, list) or len(ranks) > MAX_LIST_ITEMS:
            raise _error("field 'ranks' must be a list of at most 4,096 publishers")
        check_free_form(ranks, "field 'ranks'")
    _object(message, "stats")


def _summary(message: Mapping[str, Any]) -> None:
    _string(message, "node", MAX_NAME_CHARS)
    ranks = message.get("ranks")
    if not isinstance(ranks, list) or not ranks or len(ranks) > MAX_LIST_ITEMS:
        raise _error("field 'ranks' must be a list of 1 to 4,096 ranks")
    if not all(type(rank) is int and 0 <= rank < 1 << 63 for rank in ranks):
        raise _error("field 'ranks' must hold ranks (whole numbers from 0)", "out of range")
    spreads = message.get("metrics")
    if not isinstance(spreads, dict) or len(spreads) > MAX_METRICS:
        raise _error(f"field 'metrics' must be an object of at most {MAX_METRICS:,} metrics")
    check_free_form(spreads, "field 'metrics'")
    for name, spread in spreads.items():
        if len(name) > MAX_NAME_CHARS or not isinstance(spread, dict):
            raise _error(f"summary metric {name[:80]!r}: an object, under a name of at most 256 characters")
        for field in ("min", "median", "max"):
            check_number(spread.get(field), f"summary {field} of {name[:80]!r}")
    per_rank = message.get("per_rank")
    if per_rank is not None:
        if not isinstance(per_rank, dict) or len(per_rank) > MAX_METRICS:
            raise _error("field 'per_rank' must be an object of lists")
        for name, values in per_rank.items():
            if not isinstance(values, list) or len(values) != len(ranks):
                raise _error(f"per_rank {name[:80]!r} must hold one value per rank")
            for value in values:
                check_number(value, "per_rank", name[:80])
    for field in ("steps", "gpus"):
        if message.get(field) is not None:
            check_free_form(message[field], f"field {field!r}")
    beats = message.get("beats")
    if beats is not None:
        if not isinstance(beats, list) or len(beats) != len(ranks) or not all(
            isinstance(beat, dict) for beat in beats
        ):
            raise _error("field 'beats' must hold one object per rank")
        for beat in beats:
            _watchdog_fields(beat, "silent_s")


def _run_start(message: Mapping[str, Any]) -> None:
    for field in ("config", "versions", "repro", "model", "monitoring"):
        _object(message, field)
    argv = message.get("argv")
    if argv is not None:
        if not isinstance(argv, list) or len(argv) > MAX_LIST_ITEMS:
            raise _error("field 'argv' must be a list of at most 4,096 strings")
        check_free_form(argv, "field 'argv'")
    for field in ("cwd", "gpu_source"):
        _string(message, field, MAX_TEXT_CHARS, required=False)
    seed = message.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _error("field 'seed' must be an integer or null")  # any 64-bit value (torch's are unsigned)
    for field in ("pid", "world_size"):
        if message.get(field) is not None:
            _integer(message, field)


def _run_end(message: Mapping[str, Any]) -> None:
    _choice(message, "status", ("completed", "failed", "interrupted"))
    _string(message, "error", MAX_TEXT_CHARS, required=False)


#: Message type -> the checks of its body.
BODY_CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "metrics": _metrics,
    "gpu": _gpu,
    "event": _event,
    "invariant": _invariant,
    "heartbeat": _heartbeat,
    "run_start": _run_start,
    "run_end": _run_end,
    "relay": _relay,
    "summary": _summary,
}


#: A field not in the message (None would be its ``null``).
_ABSENT = object()


def check_message(message: Mapping[str, Any]) -> None:
    """Every rule for one decoded message whose ``v`` and ``type`` are already known to be good.

    The envelope as publishers write it (names, 64-bit counters, a float time) passes one
    expression; anything else goes through the field-by-field checks, which name the field in
    error. A viewer runs this for every message it receives (50,000 a second under load), and
    its checks were the larger part of the receiver's time (``benchmarks/ingest.py``).
    """
    get = message.get
    run, host, rank, seq, ts = get("run"), get("host"), get("rank"), get("seq"), get("ts")
    if not (
        run.__class__ is str and host.__class__ is str and len(run) <= MAX_NAME_CHARS
        and len(host) <= MAX_NAME_CHARS and rank.__class__ is int and seq.__class__ is int
        and 0 <= rank <= MAX_INT and 0 <= seq <= MAX_INT and ts.__class__ is float and 0 <= ts < math.inf
    ):
        _envelope(message)
    step = get("step", _ABSENT)
    if (step.__class__ is not int or not 0 <= step <= MAX_INT) and (
        step is not _ABSENT or message["type"] == "metrics"
    ):
        _integer(message, "step")
    BODY_CHECKS[message["type"]](message)


def _envelope(message: Mapping[str, Any]) -> None:
    """The envelope's rules one field at a time, for a message the one-expression check did not pass."""
    _string(message, "run", MAX_NAME_CHARS)
    _integer(message, "rank")
    _string(message, "host", MAX_NAME_CHARS)
    ts = message.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise _error("field 'ts' missing or not a time in seconds")
    _integer(message, "seq")


def _short(value: Any) -> str:
    """A value as an error message may quote it: its repr, cut short (it may be huge)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
