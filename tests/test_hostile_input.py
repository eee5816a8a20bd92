"""Hostile and odd input: each failure found by fuzzing and flooding, kept fixed.

Real parts throughout: the real decoder, store and app, real ZeroMQ sockets, a real publisher, the
real knowledge base and its command line in a subprocess.
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import time
from pathlib import Path

import orjson
import pytest
import zmq
from helpers.cli import TUIMON
from helpers.peers import RawPublisher
from helpers.recordings import write_recording
from helpers.runs import RunBuilder
from helpers.waiting import wait_for_screen, wait_until
from textual.widgets import Tab

from publisher.wire.protocol import SNAPSHOT_REQUEST, ProtocolError, decode, encode
from publisher.wire.transport import Publisher
from publisher.wire.validation import MAX_DEPTH, MAX_METRICS
from tuimon.kb import KnowledgeBase
from tuimon.sink import Batch
from tuimon.sources.live import LiveSource
from tuimon.sources.replay import ReplaySource
from tuimon.store import MAX_EVENTS, Store
from tuimon.store.store import MAX_METRIC_NAMES
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.charts import MAX_TABS, MetricChart
from tuimon.ui.dashboard.events import MAX_ROWS, EventLog
from tuimon.ui.dashboard.gpu import GpuCard
from tuimon.ui.event_detail import EventDetailScreen


def deep_json(depth: int) -> str:
    """JSON nested ``depth`` levels deep, written directly (encoders refuse to go that deep)."""
    return '{"next":' * (depth - 1) + '{"leaf":1}' + "}" * (depth - 1)


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"next": value}
    return value


# -- the decoder: one rule book, per message ------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"type": ["metrics"]}, "unknown type"),
        ({"v": True}, "wrong version"),
        ({"step": 2**63}, "out of range"),
        ({"step": -1}, "out of range"),
        ({"rank": "0"}, "invalid field"),
        ({"run": "r" * 300}, "too large"),
        ({"ts": "now"}, "invalid field"),
        ({"metrics": {"loss": [1, 2]}}, "invalid field"),
        ({"metrics": {"loss": "NaN"}}, "invalid field"),
        ({"metrics": {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}}, "too large"),
        ({"layers": nested(MAX_DEPTH + 1)}, "too deep"),
    ],
)
def test_a_metrics_message_of_the_wrong_shape_is_refused_with_its_reason(change: dict, reason: str) -> None:
    message = {**RunBuilder().metrics(3, loss=0.5), **change}
    with pytest.raises(ProtocolError) as refused:
        decode(orjson.dumps(message))
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("device", "accepted"),
    [
        ({"index": 0, "util": "inf", "temp_c": "nan"}, True),  # the protocol's own markers
        ({"index": 0, "util": "busy"}, False),
        ({"index": 0, "util": True}, False),
        ({"index": -1}, False),
        ({"index": 0, "throttle": "hw_thermal"}, False),
        ({"index": 0, "name": "x" * 1000}, False),
    ],
)
def test_gpu_fields_are_numbers_or_markers(device: dict, accepted: bool) -> None:
    frame = encode(RunBuilder().message("gpu", step=1, devices=[device]))
    if accepted:
        assert decode(frame)["devices"] == [device]
    else:
        with pytest.raises(ProtocolError):
            decode(frame)


def test_event_details_are_bounded_in_depth_and_size() -> None:
    builder = RunBuilder()
    ok = builder.event(1, "0-1", "loss_spike", "warning", "deep but fine", tree=nested(MAX_DEPTH - 1))
    assert decode(encode(ok))["details"]["tree"]
    for details, reason in ((nested(300), "too deep"), ({"text": "x" * 20_000}, "oversized")):
        frame = json.dumps(builder.event(1, "0-2", "loss_spike", "warning", "bad", **details)).encode()
        with pytest.raises(ProtocolError) as refused:
            decode(frame)
        assert refused.value.reason in (reason, "too large")


# -- the receiver: a bad message is counted and skipped alone -------------------------------------


def test_one_bad_message_in_a_burst_loses_nothing_else(raw_publisher: RawPublisher) -> None:
    """It used to drop its whole read batch: 206 frames gone, 201 of them valid, nothing counted."""
    source = LiveSource([raw_publisher.endpoint])
    source.start()
    try:
        builder = raw_publisher.builder
        wait_until(lambda: source.store.counters().received > 0, what="subscription",
                   tick=lambda: raw_publisher.send(builder.message("run_start", config={})))
        start_received = source.store.counters().received
        bad = [
            {**builder.metrics(1, loss=1.0), "type": ["metrics"]},
            {**builder.metrics(1, loss=1.0), "step": 2**63},
            builder.message("gpu", step=1, devices=[{"index": 0, "util": "busy"}]),
        ]
        good = [builder.metrics(step, loss=1.0 / step) for step in range(1, 201)]
        for message in good[:100] + bad + good[100:]:
            raw_publisher.pub.send(orjson.dumps(message))
        wait_until(lambda: source.store.counters().received >= start_received + 203, what="every frame")
        # The sender is shown once its snapshot wait is over (this peer answers none).
        wait_until(lambda: len(source.store.series(builder.run, "loss")[0]) == 200, timeout_s=10,
                   what="every valid step")
        counters = source.store.counters()
        steps, _ = source.store.series(builder.run, "loss")
        assert list(steps) == list(range(1, 201))
        assert counters.malformed == 3
        assert counters.malformed_by_reason == {"unknown type": 1, "out of range": 1, "invalid field": 1}
    finally:
        source.stop()


# -- the store and the screen: bounded memory, every value shown ----------------------------------


def test_the_store_keeps_bounded_names_events_and_runs() -> None:
    store = Store()
    builder = RunBuilder("wide")
    store.deliver(Batch([builder.metrics(1, **{f"m{i}": float(i) for i in range(1000)})]))
    assert len(store.metric_names("wide")) == MAX_METRIC_NAMES
    assert store.run_view("wide").metrics_left_out == 1000 - MAX_METRIC_NAMES
    store.deliver(Batch([builder.event(1, f"e{i}", "custom", "info", "x") for i in range(MAX_EVENTS + 500)]))
    events = store.events("wide")
    assert len(events) == MAX_EVENTS and events[-1].id == f"e{MAX_EVENTS + 499}"
    store.deliver(Batch([RunBuilder(f"run{i}").message("heartbeat", step=1) for i in range(200)]))
    assert len(store.run_names()) == 64
    assert any("more runs not shown" in notice for notice in store.notices())


async def test_non_finite_gpu_readings_and_a_thousand_metrics_show_without_a_crash(tmp_path: Path) -> None:
    """A gpu message with "util": "inf" ended watch and replay with OverflowError; a metrics
    message with 1,000 names took 3 s a key press (each tab rebuilt all tabs)."""
    builder = RunBuilder("odd")
    messages = [builder.run_start()]
    for step in range(1, 6):
        messages.append(builder.metrics(step, loss=1.0, **{f"extra_{i}": float(i) for i in range(1000)}))
        messages.append(builder.message("gpu", step=step, devices=[
            {"index": 0, "util": "inf", "mem_used": "nan", "mem_total": 80, "temp_c": "-inf",
             "power_w": 1e300},
            {"index": 1, "util": 50.0},
        ]))
    app = TuimonApp(ReplaySource([write_recording(tmp_path / "odd.jsonl", messages)], speed=math.inf))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_screen(pilot, lambda: len(app.query(GpuCard)) == 2, what="the GPU cards")
        card = str(app.query_one("#gpu-0-0", GpuCard).visual)
        assert "inf %" in card and "util" in card
        chart = app.query_one(MetricChart)
        await wait_for_screen(pilot, lambda: len(chart.names) == MAX_METRIC_NAMES, what="the metrics")
        assert len(chart.query(Tab)) == MAX_TABS
        assert f"+{MAX_METRIC_NAMES - MAX_TABS} more: c" in chart.border_title
        assert f"{1000 + 1 - MAX_METRIC_NAMES:,} not kept" in chart.border_title
        await pilot.press("c")  # the next metric: the app answers
        await wait_for_screen(pilot, lambda: chart.metric != "loss", what="the next chart")


async def test_a_flood_of_distinct_events_leaves_the_event_log_bounded(tmp_path: Path) -> None:
    """100,000 distinct event ids took the viewer from 72 to 760 MB: the log kept every row."""
    builder = RunBuilder("flood")
    messages = [builder.run_start()]
    messages += [builder.event(i, f"e{i}", "custom", "info", f"event {i}") for i in range(MAX_EVENTS + 2000)]
    app = TuimonApp(ReplaySource([write_recording(tmp_path / "events.jsonl", messages)], speed=math.inf))
    async with app.run_test(size=(160, 48)) as pilot:
        log = app.query_one(EventLog)
        last = f"e{MAX_EVENTS + 1999}"
        await wait_for_screen(pilot, lambda: log.row_count and log.highlighted_key == last, timeout_s=60,
                              what="the last event")
        assert log.row_count == MAX_ROWS
        assert f"Events ({MAX_EVENTS:,}, 0 critical)  latest" in str(log.framed_by.border_title)
        assert len(app.store.events("flood")) == MAX_EVENTS
        assert len(app.kb_link._offered) <= 2 * (MAX_EVENTS + 2000)


async def test_an_event_nested_to_the_limit_opens_in_the_detail_view(tmp_path: Path) -> None:
    builder = RunBuilder("deep")
    event = builder.event(3, "0-1", "custom", "warning", "deep details", tree=nested(MAX_DEPTH - 2))
    decode(encode(event))  # within the protocol's bounds
    app = TuimonApp(ReplaySource([write_recording(tmp_path / "deep.jsonl", [builder.run_start(), event])]))
    async with app.run_test(size=(160, 48)) as pilot:
        log = app.query_one(EventLog)
        await wait_for_screen(pilot, lambda: log.row_count == 1, what="the event")
        await pilot.press("e", "enter")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, EventDetailScreen), what="the details")
        assert "leaf: 1" in str(app.screen.query_one("#event-detail").visual)


# -- the publisher: its own messages always fit; the snapshot socket is metered -------------------


def test_the_publishers_own_oversized_details_are_cut_to_fit(context: zmq.Context) -> None:
    from publisher.wire.jsonsafe import json_safe

    with Publisher("fit", register=False) as publisher:
        sub = context.socket(zmq.SUB)
        sub.subscribe(b"")
        sub.connect(publisher.endpoint)
        time.sleep(0.3)
        details = json_safe({"huge": "y" * 100_000, "deep": nested(50), "many": list(range(50_000))})
        publisher.publish("event", step=1, id="0-1", severity="warning", kind="custom", message="m",
                          details=details, count=1)
        assert sub.poll(3000)
        event = decode(sub.recv())
        assert event["type"] == "event" and event["message"] == "m"
        assert "left out" in json.dumps(event["details"])


def test_each_connection_gets_one_snapshot_and_junk_is_counted(context: zmq.Context) -> None:
    with Publisher("gate", register=False) as publisher:
        publisher.publish("run_start", config={})
        peer = context.socket(zmq.DEALER)
        peer.linger = 0
        peer.connect(publisher.snapshot_endpoint)
        peer.send(SNAPSHOT_REQUEST)
        assert peer.poll(3000)
        peer.recv_multipart()
        for frame in (SNAPSHOT_REQUEST, b"junk", SNAPSHOT_REQUEST):
            peer.send(frame)
        wait_until(lambda: publisher.stats()["bad_requests"] == 1, what="the junk counted")
        wait_until(lambda: publisher.stats()["snapshots_refused"] == 2, what="the repeats refused")
        assert not peer.poll(300)  # a second reply on one connection: never
        fresh = context.socket(zmq.DEALER)
        fresh.linger = 0
        fresh.connect(publisher.snapshot_endpoint)
        fresh.send(SNAPSHOT_REQUEST)
        assert fresh.poll(3000)  # a new viewer is still served
        assert publisher.stats()["snapshots"] == 2


def test_binding_beyond_loopback_needs_curve_keys_or_warns_who_can_read_the_run(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-keys-here"))
    with pytest.raises(ValueError, match=r"needs CURVE keys .*`tuimon keys`"):
        Publisher("refused", endpoint="tcp://0.0.0.0:*", register=False)
    with caplog.at_level(logging.WARNING, logger="publisher.wire.transport"):
        with Publisher("open", endpoint="tcp://0.0.0.0:*", register=False, insecure=True):
            pass
        with Publisher("closed", register=False):
            pass
    warnings = [r.getMessage() for r in caplog.records if "beyond this machine" in r.getMessage()]
    assert len(warnings) == 1 and "0.0.0.0" in warnings[0] and "argv" in warnings[0]


# -- the knowledge base: each file stands alone; no input reaches a traceback ---------------------


def _cli(*args: str, kb: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*TUIMON, "incidents", *args, "--kb", str(kb)], input=stdin, capture_output=True,
                          timeout=60)


def exported_with_evidence(tmp_path: Path) -> Path:
    """One incident opened from an event (so its export holds ```json evidence blocks)."""
    with KnowledgeBase.open(tmp_path / "source-kb", author="alice") as kb:
        event = RunBuilder("r").event(5, "0-1", "loss_spike", "warning", "good one", loss=9.0)
        kb.open_from_event(event, metrics={"loss": ([4, 5, 6], [1.0, 9.0, 1.0])})
        kb.export(tmp_path / "out")
    [path] = (tmp_path / "out").glob("*.md")
    return path


def with_json_block(text: str, block: str) -> str:
    """``text`` with its first ```json block's content replaced by ``block``."""
    return re.sub(r"```json\n.*?\n```", lambda _: f"```json\n{block}\n```", text, count=1, flags=re.S)


def test_an_import_folder_with_bad_files_imports_the_good_ones(tmp_path: Path) -> None:
    good = exported_with_evidence(tmp_path)
    text = good.read_text()
    # json.loads recursed into a RecursionError; a huge number overflowed SQLite: either stopped
    # the whole import with a traceback, and the rest of the folder was skipped.
    (good.parent / "a-deep.md").write_text(with_json_block(text, deep_json(5000)))
    huge = text.replace("- **Number:** 1\n", f"- **Number:** {10**30}\n")
    (good.parent / "b-huge-number.md").write_text(huge)
    done = _cli("import", str(good.parent), kb=tmp_path / "kb")
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err, err
    problems = [line for line in (out + err).splitlines() if "-deep.md:" in line or "-number.md:" in line]
    assert len(problems) == 2, out + err
    assert "loss_spike at step 5, run r" in _cli("list", kb=tmp_path / "kb").stdout.decode()


def test_evidence_nested_beyond_the_bound_is_refused_at_import(tmp_path: Path) -> None:
    """A 900-deep block used to be accepted, then broke show and every export."""
    path = exported_with_evidence(tmp_path)
    path.write_text(with_json_block(path.read_text(), deep_json(900)))
    done = _cli("import", str(path), kb=tmp_path / "kb")
    assert done.returncode == 1 and "nested deeper than" in (done.stdout + done.stderr).decode()
    assert _cli("export", "--out", str(tmp_path / "again"), kb=tmp_path / "kb").returncode == 0


@pytest.mark.parametrize(
    ("args", "stdin", "says"),
    [
        (("add-note", "1", "-"), b"\xff\xfe binary \x00", "not UTF-8"),
        (("tried", "1", "x", "--step", str(2**70)), b"", "whole number"),
        (("new", "--title", "t", "--rank", str(2**70)), b"", "whole number"),
        (("show", "9" * 40), b"", "no incident"),
    ],
)
def test_odd_command_line_input_gets_one_line_and_a_non_zero_exit(
    tmp_path: Path, args: tuple[str, ...], stdin: bytes, says: str
) -> None:
    kb = tmp_path / "kb"
    _cli("new", "--title", "target", kb=kb)
    done = _cli(*args, kb=kb, stdin=stdin)
    err = done.stderr.decode()
    assert done.returncode == 2 and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
