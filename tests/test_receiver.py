"""The live source against real sockets: raw protocol peers and the real Publisher."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from helpers.peers import RawPublisher
from helpers.ports import nobody_listening
from helpers.waiting import wait_until

from publisher.wire.protocol import MAX_MESSAGE_BYTES, encode
from publisher.wire.transport import Publisher
from tuimon.errors import UserError
from tuimon.sources.live import SILENT_ENDPOINT_S, SNAPSHOT_TIMEOUT_S, LiveSource, parse_endpoint


@pytest.fixture
def sources() -> Iterator[list[LiveSource]]:
    """Live sources started by a test, stopped after it whatever happens."""
    started: list[LiveSource] = []
    yield started
    for source in started:
        source.stop()


def start(sources: list[LiveSource], *args: object, **kwargs: object) -> LiveSource:
    source = LiveSource(*args, **kwargs)
    source.start()
    sources.append(source)
    return source


class Stream:
    """Keeps a raw publisher going: one metrics message per tick, a heartbeat every fifth."""

    def __init__(self, publisher: RawPublisher, step: int = 0) -> None:
        self.publisher = publisher
        self.step = step
        self.request: bytes | None = None

    def tick(self) -> None:
        self.publisher.metrics(self.step, loss=1.0 / (1 + self.step))
        if self.step % 5 == 0:
            self.publisher.heartbeat(self.step)
        self.step += 1
        self.request = self.request or self.publisher.poll_request()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
        ("5555", "tcp://127.0.0.1:5555"),
        ("node7:6000", "tcp://node7:6000"),
        ("tcp://[::1]:5555", "tcp://[::1]:5555"),
        ("ipc:///tmp/run.sock", "ipc:///tmp/run.sock"),
    ],
)
def test_endpoints_are_normalised(text: str, expected: str) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("bad::endpoint", "not a ZeroMQ endpoint"),
        ("tcp://127.0.0.1", "needs HOST:PORT"),
        ("tcp://*:5555", "'*' is for binding"),
        ("tcp://127.0.0.1:70000", "out of range"),
        ("ipc://", "needs a socket path"),
        ("http://example.com/", "not a ZeroMQ endpoint"),
    ],
)
def test_bad_endpoints_are_refused_with_the_problem_and_an_example(text: str, problem: str) -> None:
    with pytest.raises(UserError) as error:
        parse_endpoint(text)
    assert problem in str(error.value)
    assert repr(text) in str(error.value) and "e.g. tcp://127.0.0.1:5555" in str(error.value)


def test_late_joiner_gets_history_by_snapshot_without_gap_or_duplicate(
    raw_publisher: RawPublisher, sources: list[LiveSource]
) -> None:
    raw_publisher.send(raw_publisher.builder.run_start())
    stream = Stream(raw_publisher)
    for _ in range(100):  # sent before the viewer exists: only a snapshot can bring these
        stream.tick()
    raw_publisher.send_new(
        "event",
        step=50,
        id="0-1",
        severity="warning",
        kind="loss_spike",
        message="spike",
        details={},
        count=1,
    )
    source = start(sources, [raw_publisher.endpoint])
    wait_until(lambda: stream.request is not None, what="a snapshot request", tick=stream.tick)
    seq, frames = raw_publisher.snapshot_frames()
    for _ in range(5):  # live messages after the snapshot point: the viewer must keep them
        stream.tick()
    raw_publisher.reply(stream.request, seq, frames)
    for _ in range(20):
        stream.tick()
    last = stream.step - 1
    store = source.store
    wait_until(lambda: list(store.series("raw", "loss")[0][-1:]) == [last], what="the last step")

    steps = list(store.series("raw", "loss")[0])
    assert steps == list(range(last + 1))  # every step once: nothing missed, nothing twice
    assert store.counters().gaps == 0
    assert [e.kind for e in store.events("raw")] == ["loss_spike"]
    assert store.run_view("raw").run_start is not None


def test_frames_a_late_joiners_snapshot_held_that_arrive_after_it_are_not_applied_twice(
    raw_publisher: RawPublisher, sources: list[LiveSource]
) -> None:
    """The snapshot comes on its own connection: steps the sender published before serving it
    (so the snapshot holds them) can reach the viewer's SUB socket after it. Seen once each."""
    raw_publisher.send(raw_publisher.builder.run_start())
    stream = Stream(raw_publisher)
    for _ in range(50):
        stream.tick()
    source = start(sources, [raw_publisher.endpoint])
    wait_until(lambda: stream.request is not None, what="a snapshot request", tick=stream.tick)
    in_flight = [raw_publisher.metrics_in_flight(stream.step + i, loss=0.5) for i in range(5)]
    stream.step += len(in_flight)
    seq, frames = raw_publisher.snapshot_frames()
    raw_publisher.reply(stream.request, seq, frames)
    store = source.store
    joined = stream.step - 1
    wait_until(lambda: list(store.series("raw", "loss")[0][-1:]) == [joined], what="the snapshot applied")
    for message in in_flight:
        raw_publisher.deliver(message)
    for _ in range(20):
        stream.tick()
    last = stream.step - 1
    wait_until(lambda: list(store.series("raw", "loss")[0][-1:]) == [last], what="the last step")

    steps = list(store.series("raw", "loss")[0])
    assert steps == list(range(last + 1))  # every step once: nothing missed, nothing twice
    assert store.counters().gaps == 0


def test_real_publisher_found_in_the_registry_and_joined_mid_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sources: list[LiveSource]
) -> None:
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path))
    publisher = Publisher("registered", heartbeat_s=0.2)
    try:
        publisher.publish("run_start", config={}, world_size=1, gpu_source="none")
        for step in range(300):
            publisher.publish("metrics", step=step, metrics={"loss": 1.0})
        source = start(sources, registry_dir=tmp_path)
        step = 300

        def tick() -> None:
            nonlocal step
            publisher.publish("metrics", step=step, metrics={"loss": 1.0})
            step += 1

        wait_until(lambda: "registered" in source.store.run_names(), what="the run on screen", tick=tick)
        for _ in range(50):
            tick()
            time.sleep(0.005)
    finally:
        publisher.close()
    store = source.store
    wait_until(lambda: store.run_view("registered").health == "ended", what="the run's end")
    steps = list(store.series("registered", "loss")[0])
    assert steps == list(range(step))
    assert store.counters().gaps == 0
    assert store.run_view("registered").end_status == "completed"


def test_publisher_that_never_answers_the_snapshot_is_shown_live(
    raw_publisher: RawPublisher, sources: list[LiveSource]
) -> None:
    stream = Stream(raw_publisher, step=1000)
    stream.tick()
    source = start(sources, [raw_publisher.endpoint])
    wait_until(lambda: stream.request is not None, what="a snapshot request", tick=stream.tick)
    started = time.monotonic()
    wait_until(
        lambda: source.store.run_names(),
        timeout_s=SNAPSHOT_TIMEOUT_S + 3,
        tick=stream.tick,
        what="live data after the snapshot timeout",
    )
    assert time.monotonic() - started >= SNAPSHOT_TIMEOUT_S - 0.2
    assert any("no snapshot reply" in notice for notice in source.store.notices())
    before = source.store.run_view("raw").step
    wait_until(lambda: source.store.run_view("raw").step > before, tick=stream.tick, what="steps advancing")


def test_malformed_oversized_and_wrong_version_frames_are_counted_and_skipped(
    raw_publisher: RawPublisher, sources: list[LiveSource]
) -> None:
    source = start(sources, [raw_publisher.endpoint])
    raw_publisher.send(raw_publisher.builder.run_start())
    store = source.store
    wait_until(
        lambda: store.run_names() == ["raw"],
        tick=lambda: raw_publisher.send(raw_publisher.builder.run_start()),
        what="the subscription",
    )
    wrong_version = dict(raw_publisher.builder.metrics(1, loss=1.0), v=2)
    bad = [
        b"not json at all",
        b"[" * 100_000,  # nested deep enough to hit the JSON parser's recursion limit
        json.dumps(wrong_version).encode(),
        b'{"v": 1, "type": "metrics"}',
        b"{" + b" " * MAX_MESSAGE_BYTES + b"}",
    ]
    for frame in bad:
        raw_publisher.pub.send(frame)
    raw_publisher.metrics(7, loss=0.5)
    wait_until(
        lambda: list(store.series("raw", "loss")[0]) == [7], what="the valid message after the bad ones"
    )
    counters = store.counters()
    assert counters.malformed == len(bad)
    assert counters.malformed_by_reason == {
        "not JSON": 2,
        "wrong version": 1,
        "invalid field": 1,
        "oversized": 1,
    }


def test_silent_endpoint_is_reported_with_what_to_do(context: zmq.Context, sources: list[LiveSource]) -> None:
    with nobody_listening() as endpoint:
        source = start(sources, [endpoint])
        wait_until(lambda: source.store.notices(), timeout_s=SILENT_ENDPOINT_S + 3, what="a notice")
        (notice,) = source.store.notices()
    assert f"nothing heard from {endpoint}" in notice and "tuimon watch" in notice


@contextlib.contextmanager
def not_zeromq() -> Iterator[str]:
    """A tcp address where another kind of program listens: it answers every connection with an
    HTTP error and hangs up."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.1)
        stop = threading.Event()

        def answer() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    connection, _ = server.accept()
                    with connection, contextlib.suppress(OSError):
                        connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 8)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
        finally:
            stop.set()
            thread.join()


def test_a_peer_that_is_not_zeromq_is_not_called_a_curve_refusal(sources: list[LiveSource]) -> None:
    with not_zeromq() as endpoint:
        source = start(sources, [endpoint])
        wait_until(lambda: any("handshake" in n for n in source.store.notices()), what="a notice")
    (notice,) = [n for n in source.store.notices() if "handshake" in n]
    assert notice.startswith(f"the program at {endpoint} broke off the handshake")
    assert "not a tuimon socket" in notice and "requires CURVE" not in notice


def test_empty_registry_says_where_it_looks(tmp_path: Path, sources: list[LiveSource]) -> None:
    source = start(sources, registry_dir=tmp_path)
    wait_until(lambda: source.store.notices(), what="a notice")
    (notice,) = source.store.notices()
    assert notice.startswith("waiting for runs") and str(tmp_path) in notice


def test_run_filter_keeps_only_that_run(context: zmq.Context, sources: list[LiveSource]) -> None:
    wanted, other = RawPublisher(context, run="wanted"), RawPublisher(context, run="other")
    try:
        source = start(sources, [wanted.endpoint, other.endpoint], run="wanted")

        def tick() -> None:
            for publisher in (wanted, other):
                publisher.send(publisher.builder.run_start())

        wait_until(lambda: source.store.run_names() == ["wanted"], tick=tick, what="the wanted run")
        time.sleep(0.2)
        assert source.store.run_names() == ["wanted"]
        assert source.store.counters().received > len(wanted.sent)  # the other run was heard, not kept
    finally:
        wanted.close()
        other.close()


def test_snapshot_header_that_is_not_json_is_counted_and_live_data_goes_on(
    raw_publisher: RawPublisher, sources: list[LiveSource]
) -> None:
    stream = Stream(raw_publisher, step=500)
    stream.tick()
    source = start(sources, [raw_publisher.endpoint])
    wait_until(lambda: stream.request is not None, tick=stream.tick, what="a snapshot request")
    raw_publisher.router.send_multipart([stream.request, b"garbage", encode(raw_publisher.sent[-1])])
    wait_until(lambda: source.store.run_names(), tick=stream.tick, what="live data")
    assert source.store.counters().malformed == 1
    assert "snapshot reply" in source.store.counters().last_malformed
