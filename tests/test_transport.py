"""The publisher seen from a viewer: real PUB/SUB and ROUTER/DEALER sockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from helpers.ports import free_port
from helpers.publisher_client import receive, receive_until, request_snapshot, subscribe
from helpers.recordings import of_type
from helpers.waiting import wait_until

from publisher.wire.history import SnapshotHistory
from publisher.wire.protocol import SNAPSHOT_REQUEST, decode, encode, make_message
from publisher.wire.registry import live_entries
from publisher.wire.transport import HANDOFF_S, Publisher


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    """Publishers made by a test, closed even when the test fails."""
    made: list[Publisher] = []
    yield made
    for publisher in made:
        publisher.close(timeout=0.5)


def start(publishers: list[Publisher], run: str = "run", **options: object) -> Publisher:
    publisher = Publisher(run, **options)
    publishers.append(publisher)
    return publisher


def connected(context: zmq.Context, publisher: Publisher, **options: int) -> zmq.Socket:
    """A SUB that has provably joined: it has received a heartbeat (needs a short heartbeat_s)."""
    sub = subscribe(context, publisher.endpoint, **options)
    receive_until(sub, lambda m: m["type"] == "heartbeat")
    return sub


# --- binding ----------------------------------------------------------------------------------------


def test_default_bind_is_loopback_on_free_ports(publishers: list[Publisher]) -> None:
    first, second = start(publishers), start(publishers)

    for publisher in (first, second):
        assert publisher.endpoint.startswith("tcp://127.0.0.1:")
        assert publisher.snapshot_endpoint.startswith("tcp://127.0.0.1:")
        assert int(publisher.endpoint.rpartition(":")[2]) > 0
    assert len({first.endpoint, first.snapshot_endpoint, second.endpoint, second.snapshot_endpoint}) == 4


@pytest.mark.parametrize(
    "endpoint",
    ["bogus", "", "tcp://127.0.0.1:notaport", "tcp://192.0.2.1:*", "udp://127.0.0.1:5555", "inproc://x"],
)
def test_an_invalid_endpoint_fails_at_once_with_a_one_line_explanation(endpoint: str) -> None:
    threads_before = threading.active_count()

    with pytest.raises(ValueError) as error:
        Publisher("bad", endpoint=endpoint, insecure=True)  # insecure: get past CURVE to the bind

    message = str(error.value)
    assert repr(endpoint) in message
    assert "tcp://127.0.0.1:*" in message  # an example that works
    assert "\n" not in message
    assert live_entries() == []
    assert threading.active_count() == threads_before


def test_an_endpoint_already_in_use_is_reported(publishers: list[Publisher]) -> None:
    taken = start(publishers).endpoint

    with pytest.raises(ValueError, match="in use"):
        Publisher("second", endpoint=taken)


def test_an_explicit_endpoint_is_honoured(publishers: list[Publisher]) -> None:
    port = free_port()
    publisher = start(publishers, endpoint=f"tcp://127.0.0.1:{port}")

    assert publisher.endpoint == f"tcp://127.0.0.1:{port}"


def test_an_ipc_endpoint_puts_the_snapshot_socket_beside_it(
    publishers: list[Publisher], context: zmq.Context, tmp_path: Path
) -> None:
    publisher = start(publishers, endpoint=f"ipc://{tmp_path}/pub", heartbeat_s=0.05)
    publisher.publish("run_start", config={})

    assert publisher.snapshot_endpoint == f"ipc://{tmp_path}/pub.snapshot"
    connected(context, publisher)
    _, snapshot = request_snapshot(context, publisher.snapshot_endpoint)
    assert [m["type"] for m in snapshot] == ["run_start"]


def test_a_broken_runtime_folder_does_not_stop_training(
    publishers: list[Publisher],
    context: zmq.Context,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path / "link"))

    publisher = start(publishers, heartbeat_s=0.05)

    assert "not discoverable" in caplog.text and publisher.endpoint in caplog.text
    connected(context, publisher)  # the stream works; viewers just need its address


# --- live stream --------------------------------------------------------------------------------------


def test_a_subscriber_receives_every_metric_in_seq_order(
    publishers: list[Publisher], context: zmq.Context
) -> None:
    publisher = start(publishers, run="llama", rank=2, host="node7", heartbeat_s=0.05)
    sub = connected(context, publisher)

    for step in range(200):
        publisher.publish("metrics", step=step, metrics={"loss": 1.0 / (step + 1)})
    received = receive_until(sub, lambda m: m.get("step") == 199 and m["type"] == "metrics")

    metrics = of_type(received, "metrics")
    assert [m["step"] for m in metrics] == list(range(200))
    assert [m["seq"] for m in received] == list(range(received[0]["seq"], received[-1]["seq"] + 1))
    assert {(m["run"], m["rank"], m["host"]) for m in received} == {("llama", 2, "node7")}
    assert metrics[5]["metrics"] == {"loss": 1.0 / 6}


def test_heartbeats_carry_the_snapshot_address_the_latest_step_and_the_counts(
    publishers: list[Publisher], context: zmq.Context, tmp_path: Path
) -> None:
    publisher = start(publishers, heartbeat_s=0.05, record=tmp_path / "r.jsonl")
    sub = connected(context, publisher)
    for step in range(10):
        publisher.publish("metrics", step=step, metrics={"loss": 1.0})

    received = receive_until(sub, lambda m: m["type"] == "heartbeat" and m.get("step") == 9)

    heartbeat = received[-1]
    assert heartbeat["snapshot"] == publisher.snapshot_endpoint
    stats = heartbeat["stats"]
    assert set(stats) == {
        "sent", "dropped", "queued", "recorded", "snapshots", "snapshots_refused", "bad_requests", "refused"
    }
    assert stats["sent"] == heartbeat["seq"]  # everything before this heartbeat went out
    assert stats["recorded"] == heartbeat["seq"]
    assert stats["dropped"] == 0


def test_a_message_the_caller_got_wrong_is_dropped_and_the_stream_goes_on(
    publishers: list[Publisher], context: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    publisher = start(publishers, heartbeat_s=0.05)
    sub = connected(context, publisher)

    publisher.publish("metrics", step=1, metrics={"loss": float("nan")})  # not in wire form: null
    publisher.publish("metrics", step=2, metrics={"loss": object()})  # not JSON at all: dropped
    publisher.publish("metrics", step=3, metrics={"loss": 0.5})

    received = receive_until(sub, lambda m: m.get("step") == 3 and m["type"] == "metrics")
    metrics = of_type(received, "metrics")
    assert [(m["step"], m["metrics"]["loss"]) for m in metrics] == [(1, None), (3, 0.5)]
    assert [m["seq"] for m in received] == list(range(received[0]["seq"], received[-1]["seq"] + 1))
    assert publisher.stats()["dropped"] == 1
    assert "metrics message dropped" in caplog.text
    with pytest.raises(ValueError, match="unknown message type"):
        publisher.publish("metric", step=4)


# --- late joiners -------------------------------------------------------------------------------------


def test_a_late_joiner_gets_the_run_start_history_and_events_then_a_seamless_live_stream(
    publishers: list[Publisher], context: zmq.Context
) -> None:
    publisher = start(publishers, heartbeat_s=0.05)
    publisher.publish("run_start", config={"lr": 0.1}, seed=7, world_size=1)
    publisher.publish("event", step=0, id="0-1", severity="info", kind="loss_spike", message="x", count=1)
    publisher.publish("invariant", step=0, name="grads_finite", status="ok")
    stop = threading.Event()

    def train() -> None:  # keeps stepping while the viewer joins: the hard case for continuity
        step = 0
        while not stop.is_set() and step < 100_000:
            publisher.publish("metrics", step=step, metrics={"loss": 1.0})
            step += 1
            stop.wait(0.0005)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        sub = connected(context, publisher)  # a viewer subscribes first...
        header, snapshot = request_snapshot(context, publisher.snapshot_endpoint)  # ...then asks
        live = receive_until(sub, lambda m: m["seq"] > header["seq"] + 50)
    finally:
        stop.set()
        trainer.join()

    assert header["type"] == "snapshot" and header["v"] == 1
    assert header["count"] == len(snapshot)
    assert [m["seq"] for m in snapshot] == sorted(m["seq"] for m in snapshot)
    assert snapshot[-1]["seq"] <= header["seq"]
    assert snapshot[0]["type"] == "run_start" and snapshot[0]["config"] == {"lr": 0.1}
    assert [m["id"] for m in of_type(snapshot, "event")] == ["0-1"]
    assert [m["status"] for m in of_type(snapshot, "invariant")] == ["ok"]
    assert of_type(snapshot, "heartbeat") == []
    # Live messages after S continue exactly where the snapshot stopped: no gap, no duplicate.
    after = [m for m in live if m["seq"] > header["seq"]]
    assert [m["seq"] for m in after] == list(range(header["seq"] + 1, header["seq"] + 1 + len(after)))
    steps = [m["step"] for m in of_type(snapshot, "metrics") + of_type(after, "metrics")]
    assert steps == list(range(len(steps)))


def test_the_snapshot_keeps_the_latest_of_each_episode_invariant_and_gpu(
    publishers: list[Publisher], context: zmq.Context
) -> None:
    publisher = start(publishers, heartbeat_s=0.05, history_metrics=50)
    sub = connected(context, publisher)
    publisher.publish("run_start", config={}, seed=None)
    spike = {"severity": "warning", "kind": "loss_spike", "message": "loss spiked"}
    publisher.publish("event", step=3, id="0-3", count=1, **spike)
    publisher.publish("event", step=5, id="0-5", count=1, **spike)
    publisher.publish("event", step=9, id="0-3", count=4, **spike)  # the episode at step 3 went on
    publisher.publish("invariant", step=2, name="params_change", status="ok")
    publisher.publish("invariant", step=8, name="params_change", status="violated", message="frozen")
    publisher.publish("gpu", simulated=True, devices=[{"index": 0, "util": 10}])
    publisher.publish("gpu", simulated=True, devices=[{"index": 0, "util": 90}])
    for step in range(200):
        publisher.publish("metrics", step=step, metrics={"loss": 1.0})
    receive_until(sub, lambda m: m.get("step") == 199 and m["type"] == "metrics")

    _, snapshot = request_snapshot(context, publisher.snapshot_endpoint)

    assert snapshot[0]["type"] == "run_start"  # however many metrics came after it
    assert [(m["id"], m["count"]) for m in of_type(snapshot, "event")] == [("0-5", 1), ("0-3", 4)]
    assert [m["status"] for m in of_type(snapshot, "invariant")] == ["violated"]
    assert [m["devices"][0]["util"] for m in of_type(snapshot, "gpu")] == [90]
    assert [m["step"] for m in of_type(snapshot, "metrics")] == list(range(150, 200))


def test_snapshot_frames_are_the_stored_bytes_in_seq_order() -> None:
    history = SnapshotHistory(max_metrics=2, max_events=2)
    frames = {}
    for seq, (msg_type, body) in enumerate(
        [
            ("run_start", {"config": {}}),
            ("event", {"id": "a", "count": 1, "severity": "info", "kind": "k", "message": "m"}),
            ("metrics", {"step": 1, "metrics": {"loss": 1.0}}),
            ("event", {"id": "b", "count": 1, "severity": "info", "kind": "k", "message": "m"}),
            ("heartbeat", {"stats": {}}),
            ("event", {"id": "c", "count": 1, "severity": "info", "kind": "k", "message": "m"}),
            ("metrics", {"step": 2, "metrics": {"loss": 1.0}}),
            ("metrics", {"step": 3, "metrics": {"loss": 1.0}}),
        ]
    ):
        message = make_message(msg_type, run="r", rank=0, host="h", ts=0.0, seq=seq, **body)
        frames[seq] = encode(message)
        history.add(message, frames[seq])

    # Event "a" is the oldest beyond max_events=2; metrics step 1 the oldest beyond max_metrics=2.
    assert history.frames() == [frames[0], frames[3], frames[5], frames[6], frames[7]]
    assert history.last_seq == 7


def test_bad_snapshot_requests_are_counted_and_ignored_and_req_clients_work_too(
    publishers: list[Publisher], context: zmq.Context
) -> None:
    publisher = start(publishers)
    publisher.publish("run_start", config={})
    bad = context.socket(zmq.DEALER)
    bad.linger = 0
    bad.connect(publisher.snapshot_endpoint)
    for junk in (b"hello", b'{"v": 1, "type": "metrics"}', b"[" * 250):
        bad.send(junk)
    bad.send_multipart([b"two", b"frames"])
    bad.send(b"x" * 10_000)  # oversized: ZeroMQ cuts this client off before it reaches the publisher

    other_spelling = b'{"type":"snapshot_request","v":1}'
    _, snapshot = request_snapshot(context, publisher.snapshot_endpoint, request=other_spelling)
    assert [m["type"] for m in snapshot] == ["run_start"]
    assert not bad.poll(100)  # no reply to junk
    wait_until(lambda: publisher.bad_requests == 4, what="4 bad requests counted")

    req = context.socket(zmq.REQ)
    req.linger = 0
    req.connect(publisher.snapshot_endpoint)
    req.send(SNAPSHOT_REQUEST)
    assert req.poll(2000)
    header_frame, *frames = req.recv_multipart()
    assert json.loads(header_frame)["count"] == len(frames) == 1


# --- never slowing training ---------------------------------------------------------------------------


@pytest.mark.timeout(30)  # publish() blocking would hang this test, not merely slow it
def test_publishing_with_no_subscriber_never_blocks_and_every_message_is_accounted_for(
    publishers: list[Publisher],
) -> None:
    publisher = start(publishers, queue_max=1_000, heartbeat_s=3600)

    for step in range(50_000):
        publisher.publish("metrics", step=step, metrics={"loss": 1.0})

    wait_until(lambda: _handled(publisher) == 50_000, what="every message sent or counted as dropped")
    stats = publisher.stats()
    assert stats["dropped"] > 0  # the bounded queue overflowed rather than waited
    assert stats["queued"] == 0


@pytest.mark.timeout(30)
def test_a_frozen_viewer_loses_only_its_own_messages_and_can_tell(
    publishers: list[Publisher], context: zmq.Context
) -> None:
    publisher = start(publishers, hwm=100, heartbeat_s=3600)
    frozen = subscribe(context, publisher.endpoint, rcvhwm=10, rcvbuf=4096)
    healthy = subscribe(context, publisher.endpoint, rcvhwm=0)
    probes = []
    wait_until(lambda: _probe_received(publisher, (frozen, healthy), probes), what="both viewers subscribed")
    wait_until(lambda: _handled(publisher) == len(probes), what="probes sent")
    pad = "x" * 500  # larger messages fill the frozen viewer's socket buffers sooner

    for step in range(50_000):
        publisher.publish("metrics", step=step, metrics={"loss": 1.0}, pad=pad)
        if step % 100 == 0:  # the healthy viewer keeps reading
            _drain(healthy)
    wait_until(lambda: _handled(publisher) == len(probes) + 50_000, timeout_s=20, what="all accounted for")

    publisher.publish("metrics", step=50_000, metrics={"loss": 0.5})
    tail = receive_until(healthy, lambda m: m.get("step") == 50_000, timeout_s=5)
    assert tail[-1]["metrics"] == {"loss": 0.5}  # the frozen viewer did not block the healthy one
    frames = []
    while frozen.poll(200):  # the frozen viewer wakes up and reads what it was sent
        frames.append(frozen.recv())
    seqs = [decode(frame)["seq"] for frame in frames]
    assert len(seqs) < 10_000  # ...which holds only what fit in its buffers
    # The next message reaches it (its buffers are empty again) after the lost ones: whether the
    # step-50,000 message above fitted depends on when ZeroMQ last moved a batch, so this one, sent
    # once it has read, is the one that shows the loss every time.
    publisher.publish("metrics", step=50_001, metrics={"loss": 0.25})
    seqs += [m["seq"] for m in receive_until(frozen, lambda m: m.get("step") == 50_001, timeout_s=5)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(seqs) if later - earlier > 1]
    assert gaps  # and sees its loss as a gap in seq


def _probe_received(publisher: Publisher, subs: tuple[zmq.Socket, ...], probes: list[int]) -> bool:
    """Publish a probe; True once every SUB has received one (subscriptions are in place). Each
    waits longer than the idle sender sleeps, so probes do not pile up unread; a late one is a valid
    message of step 0, which the test's readers skip like any other."""
    publisher.publish("metrics", step=0, metrics={})
    probes.append(1)
    return all(sub.poll(int(HANDOFF_S * 2000)) and sub.recv() for sub in subs)


def _handled(publisher: Publisher) -> int:
    """Messages the publisher is done with: sent, or counted as dropped."""
    stats = publisher.stats()
    return stats["sent"] + stats["dropped"]


def _drain(sub: zmq.Socket) -> list[bytes]:
    frames = []
    while sub.poll(0):
        frames.append(sub.recv())
    return frames


# --- closing ------------------------------------------------------------------------------------------


def test_close_sends_run_end_and_removes_the_registry_entry(
    publishers: list[Publisher], context: zmq.Context
) -> None:
    publisher = start(publishers, run="gpt", heartbeat_s=0.05)
    [entry] = live_entries()
    assert (entry.run, entry.pub) == ("gpt", publisher.endpoint)
    assert entry.snapshot == publisher.snapshot_endpoint
    sub = connected(context, publisher)
    publisher.publish("metrics", step=7, metrics={"loss": 1.0})

    publisher.close("failed", error="CUDA error: out of memory")
    publisher.close()  # a second close changes nothing

    end = receive_until(sub, lambda m: m["type"] == "run_end")[-1]
    assert (end["status"], end["error"], end["step"]) == ("failed", "CUDA error: out of memory", 7)
    assert live_entries() == []
    assert not entry.path.exists()
    publisher.publish("metrics", step=8, metrics={})  # after close: ignored, counted, no error
    assert publisher.stats()["dropped"] == 1


@pytest.mark.parametrize(
    ("raised", "status", "error"),
    [
        (None, "completed", None),
        (KeyboardInterrupt(), "interrupted", None),
        (RuntimeError("loss exploded"), "failed", "RuntimeError: loss exploded"),
    ],
)
def test_as_a_context_manager_the_run_end_says_how_the_block_ended(
    context: zmq.Context, raised: BaseException | None, status: str, error: str | None
) -> None:
    expected = pytest.raises(type(raised)) if raised else contextlib.nullcontext()
    with expected, Publisher("ctx", heartbeat_s=0.05) as publisher:
        sub = connected(context, publisher)
        if raised:
            raise raised

    end = receive(sub)
    while end["type"] != "run_end":
        end = receive(sub)
    assert end["status"] == status
    assert end.get("error") == error


EXITING_TRAINER = textwrap.dedent(
    """
    import sys
    from publisher.wire.transport import Publisher

    publisher = Publisher("forgetful", record=sys.argv[2])
    publisher.publish("metrics", step=3, metrics={"loss": 1.0})
    if sys.argv[1] == "crash":
        raise RuntimeError("diverged")
    """
)


@pytest.mark.parametrize(("how", "status"), [("normal", "completed"), ("crash", "failed")])
def test_a_script_that_never_calls_close_still_ends_its_run_cleanly(
    tmp_path: Path, how: str, status: str
) -> None:
    path = tmp_path / "run.jsonl"

    result = subprocess.run(
        [sys.executable, "-c", EXITING_TRAINER, how, str(path)], capture_output=True, text=True, timeout=30
    )

    assert (result.returncode == 0) == (how == "normal"), result.stderr
    end = decode(path.read_bytes().splitlines()[-1])
    assert (end["type"], end["status"], end["step"]) == ("run_end", status, 3)
    if how == "crash":
        assert end["error"] == "RuntimeError: diverged"
    assert list(Path(tmp_path / "runtime").glob("*.json")) == []  # entry removed at exit
