"""The wire contract: what the publisher writes, the viewer reads back; anything else is refused."""

from __future__ import annotations

import json
import math

import pytest

from publisher.wire.protocol import (
    MAX_MESSAGE_BYTES,
    ProtocolError,
    decode,
    encode,
    make_message,
    read_number,
    wire_numbers,
)

ENVELOPE = {"run": "r1", "rank": 0, "host": "node1", "ts": 1700000000.5, "seq": 3}


def wire(msg_type: str, step: int | None = None, **body: object) -> bytes:
    return encode(make_message(msg_type, step=step, **ENVELOPE, **body))


def test_round_trip_keeps_every_field_and_puts_the_envelope_first() -> None:
    frame = wire("metrics", step=12, metrics={"loss": 0.25, "lr": 3e-4}, extra={"nested": [1, 2]})

    message = decode(frame)

    assert message == {
        "v": 1, "type": "metrics", **ENVELOPE, "step": 12,
        "metrics": {"loss": 0.25, "lr": 3e-4}, "extra": {"nested": [1, 2]},
    }
    assert list(message)[:7] == ["v", "type", "run", "rank", "host", "ts", "seq"]
    assert b" " not in frame  # compact: every byte crosses SSH and fills recordings


def test_non_finite_numbers_travel_as_strings_any_json_reader_accepts() -> None:
    values = wire_numbers({"loss": math.nan, "up": math.inf, "down": -math.inf})
    frame = wire("metrics", step=1, metrics=values)

    assert json.loads(frame, parse_constant=lambda name: pytest.fail(f"bare {name} in {frame!r}"))
    values = decode(frame)["metrics"]
    assert values == {"loss": "nan", "up": "inf", "down": "-inf"}
    assert math.isnan(read_number(values["loss"]))
    assert read_number(values["up"]) == math.inf
    assert read_number(values["down"]) == -math.inf


def test_a_raw_nan_never_produces_invalid_json() -> None:
    """Bodies go through wire_numbers/json_safe; one that did not still encodes as valid JSON."""
    frame = wire("metrics", step=1, metrics={"loss": math.nan})
    assert b"NaN" not in frame
    assert decode(frame)["metrics"] == {"loss": None}


def test_a_body_cannot_overwrite_the_version_or_type() -> None:
    with pytest.raises(ValueError, match="envelope"):
        make_message("metrics", **ENVELOPE, step=1, metrics={}, type="event")


def test_fields_the_reader_does_not_know_are_ignored() -> None:
    devices = [{"index": 0, "future_field": 1}]
    message = decode(wire("gpu", simulated=True, devices=devices, added_in_v1_1="x"))

    assert message["added_in_v1_1"] == "x"


DELETE = object()  # marks a field to remove in valid()


def valid(msg_type: str = "metrics", **changes: object) -> dict:
    body = {
        "metrics": {"step": 1, "metrics": {"loss": 1.0}},
        "gpu": {"devices": [{"index": 0}]},
        "event": {
            "step": 1, "id": "0-1", "severity": "warning", "kind": "loss_spike", "message": "m", "count": 1,
        },
        "invariant": {"name": "grads_finite", "status": "ok"},
        "run_end": {"status": "completed"},
    }[msg_type]
    message = {"v": 1, "type": msg_type, **ENVELOPE, **body}
    for name, value in changes.items():
        if value is DELETE:
            del message[name]
        else:
            message[name] = value
    return message


MALFORMED = {
    "not json": b"{nope",
    "invalid utf-8": b'{"v": 1, "type": "\xff\xfe"}',
    "json array": b"[1, 2, 3]",
    "json string": b'"metrics"',
    "nested brackets bomb": b"[" * 100_000 + b"]" * 100_000,
    "oversized": json.dumps({**valid(), "pad": "x" * MAX_MESSAGE_BYTES}).encode(),
    "wrong version": valid(v=2),
    "version as string": valid(v="1"),
    "no version": valid(v=DELETE),
    "unknown type": valid(type="snapshot_request"),
    "no type": valid(type=DELETE),
    **{f"no {field}": valid(**{field: DELETE}) for field in ("run", "rank", "host", "ts", "seq")},
    "rank negative": valid(rank=-1),
    "seq negative": valid(seq=-5),
    "run name too long": valid(run="r" * 257),
    "host as number": valid(host=7),
    "ts negative": valid(ts=-1.0),
    "ts null": valid(ts=None),
    "event step null": valid("event", step=None),
    "event step negative": valid("event", step=-1),
    "rank as string": valid(rank="0"),
    "rank as bool": valid(rank=True),
    "seq as float": valid(seq=3.0),
    "ts as string": valid(ts="now"),
    "step as string": valid(step="1"),
    "metrics without step": valid(step=DELETE),
    "metrics not an object": valid(metrics=[1.0]),
    "metric value a word": valid(metrics={"loss": "low"}),
    "metric value a bool": valid(metrics={"loss": True}),
    "gpu device without index": valid("gpu", devices=[{"name": "H100"}]),
    "gpu devices not a list": valid("gpu", devices={"index": 0}),
    "event severity unknown": valid("event", severity="fatal"),
    "event without kind": valid("event", kind=DELETE),
    "event without message": valid("event", message=DELETE),
    "invariant without name": valid("invariant", name=DELETE),
    "invariant status unknown": valid("invariant", status="maybe"),
    "run_end status unknown": valid("run_end", status="exploded"),
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_messages_raise_protocol_error(frame: bytes | dict) -> None:
    if isinstance(frame, dict):
        frame = json.dumps(frame).encode()

    with pytest.raises(ProtocolError):
        decode(frame)


def test_the_valid_templates_used_above_do_decode() -> None:
    """Guards the malformed cases: each differs from a valid message by exactly its defect."""
    for msg_type in ("metrics", "gpu", "event", "invariant", "run_end"):
        assert decode(json.dumps(valid(msg_type)).encode())["type"] == msg_type


def test_an_envelope_error_names_its_field_and_what_publishers_may_write_passes() -> None:
    """The envelope is checked in one expression for what publishers write and field by field
    otherwise: an error still names the field, and a whole-number time or a message without a
    step (all but metrics) is valid."""
    for field, value, reason in (("rank", -1, "out of range"), ("seq", True, "invalid field"),
                                 ("run", "r" * 257, "too large"), ("ts", -0.5, "invalid field"),
                                 ("step", 2**63, "out of range")):
        frame = json.dumps(valid(**{field: value})).encode()
        with pytest.raises(ProtocolError) as raised:
            decode(frame)
        assert f"'{field}'" in str(raised.value) and raised.value.reason == reason, (field, raised.value)
    assert decode(json.dumps(valid(ts=1700000000)).encode())["ts"] == 1700000000
    assert "step" not in decode(json.dumps(valid("invariant")).encode())


def test_read_number_refuses_what_is_not_a_number() -> None:
    for bad in ("NaN", "1.5", True, [1]):
        with pytest.raises(ProtocolError):
            read_number(bad)
    assert read_number(None) is None
    assert read_number(2) == 2.0
