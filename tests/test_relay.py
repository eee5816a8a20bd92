"""Relays on real sockets: node relays find their node's publishers, forward them to a root, and a
viewer at the root receives every node's ranks, and only what it subscribed to."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.cli import TUIMON
from helpers.ports import free_port
from helpers.relays import running, stepping
from helpers.waiting import wait_until

from publisher.wire.protocol import decode, encode, make_message
from publisher.wire.topics import subscription
from publisher.wire.transport import Publisher
from tuimon.errors import UserError
from tuimon.relay.addresses import ingest_address
from tuimon.relay.forwarder import Relay
from tuimon.relay.summary import KEEP_S, NodeSummarizer


class Viewer:
    """A SUB socket on a relay, collecting decoded messages."""

    def __init__(self, context: zmq.Context, address: str, *topics: bytes) -> None:
        self.sub = context.socket(zmq.SUB)
        self.sub.linger = 0
        for topic in topics or (b"",):
            self.sub.subscribe(topic)
        self.sub.connect(address)
        self.messages: list[dict[str, Any]] = []

    def read(self) -> None:
        while self.sub.poll(0):
            self.messages.append(decode(self.sub.recv()))

    def of(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == msg_type]


def test_a_subscription_prefix_selects_by_type_run_and_rank() -> None:
    def frame(msg_type: str, run: str, rank: int, **body: Any) -> bytes:
        return encode(make_message(msg_type, run=run, rank=rank, host="h", ts=1.0, seq=0, **body))

    metrics_17 = frame("metrics", 'a "quoted" run', 17, step=1, metrics={"loss": 1.0})
    assert metrics_17.startswith(subscription("metrics", 'a "quoted" run', 17))
    assert metrics_17.startswith(subscription("metrics", 'a "quoted" run'))
    assert metrics_17.startswith(subscription("metrics"))
    assert not metrics_17.startswith(subscription("metrics", 'a "quoted" run', 1)), "rank 1 is not rank 17"
    assert not metrics_17.startswith(subscription("event"))
    assert not frame("metrics", "ab", 0, step=1, metrics={}).startswith(subscription("metrics", "a"))
    with pytest.raises(ValueError, match="needs its run"):
        subscription("metrics", rank=3)
    with pytest.raises(ValueError, match="unknown message type"):
        subscription("metric")


def test_the_root_address_names_its_intake() -> None:
    assert ingest_address("tcp://10.0.0.5:7000") == "tcp://10.0.0.5:7001"
    assert ingest_address("ipc:///run/tuimon/root") == "ipc:///run/tuimon/root.in"
    with pytest.raises(UserError, match="fixed address"):
        ingest_address("tcp://127.0.0.1:*")


def start_node(
    name: str, base: Path, monkeypatch: pytest.MonkeyPatch, ranks: range
) -> tuple[Path, list[Publisher]]:
    """A simulated node: its own run registry and one Publisher per rank, host ``name``."""
    registry = base / name
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(registry))
    publishers = [Publisher("job", rank, host=name, heartbeat_s=0.2) for rank in ranks]
    return registry, publishers


def test_two_nodes_reach_a_viewer_at_the_root_each_rank_by_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: zmq.Context
) -> None:
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    registry_a, node_a = start_node("nodeA", tmp_path, monkeypatch, range(0, 2))
    registry_b, node_b = start_node("nodeB", tmp_path, monkeypatch, range(2, 4))
    publishers = node_a + node_b
    root = Relay(listen=root_address, root=True, heartbeat_s=0.2)
    relays = [
        Relay(
            listen="tcp://127.0.0.1:*",
            upstream=root_address,
            registry_dir=registry,
            host=host,
            heartbeat_s=0.2,
        )
        for registry, host in ((registry_a, "nodeA"), (registry_b, "nodeB"))
    ]
    with running(root), running(relays[0]), running(relays[1]):
        everything = Viewer(context, root_address)
        events_only = Viewer(context, root_address, subscription("event"))
        step = 0

        def publish() -> None:
            nonlocal step
            step += 1
            for publisher in publishers:
                publisher.publish("metrics", step=step, metrics={"loss": 1.0 / step})
                publisher.publish(
                    "event",
                    step=step,
                    kind="loss_spike",
                    severity="warning",
                    message=f"rank {publisher.rank}",
                    id=f"e{publisher.rank}",
                    count=step,
                )
            everything.read()
            events_only.read()
            time.sleep(0.02)

        def every_rank_seen() -> bool:
            seen = {(m["rank"], m["host"]) for m in everything.of("metrics")}
            return seen == {(0, "nodeA"), (1, "nodeA"), (2, "nodeB"), (3, "nodeB")}

        wait_until(every_rank_seen, timeout_s=15, what="metrics of all four ranks at the root", tick=publish)
        wait_until(
            lambda: {m["rank"] for m in events_only.of("event")} == {0, 1, 2, 3},
            timeout_s=5,
            what="events of all four ranks",
            tick=publish,
        )
        assert not [m for m in events_only.messages if m["type"] != "event"], "subscribed to events only"
        relay_names = {"node@nodeA", "node@nodeB", root.name}
        wait_until(
            lambda: {m["run"] for m in everything.of("relay")} == relay_names,
            timeout_s=5,
            what="every relay's heartbeat",
            tick=publish,
        )

        def node_a_beats() -> list[dict[str, Any]]:
            return [m for m in everything.of("relay") if m["run"] == "node@nodeA"]

        # Its first beat went out as it started, before it had forwarded anything.
        wait_until(
            lambda: node_a_beats()[-1]["stats"]["out"] > 0,
            timeout_s=5,
            what="a beat with counts",
            tick=publish,
        )
        node_beat = node_a_beats()[-1]
        assert node_beat["upstream"] == root_address and node_beat["publishers"] == 2
        assert {(r["rank"], r["host"]) for r in node_beat["ranks"]} == {(0, "nodeA"), (1, "nodeA")}
        # Out of the proxy: the ranks' frames taken in at the intake, and the relay's own messages
        # (its seq counts them).
        assert 0 < node_beat["stats"]["out"] <= node_beat["stats"]["in"] + node_beat["seq"]
        steps = [m["step"] for m in everything.of("metrics") if m["rank"] == 3]
        assert steps == sorted(steps), "one rank's messages keep their order through two hops"
    for publisher in publishers:
        publisher.close()


def test_relays_as_commands_forward_a_publisher_and_a_killed_node_relay_is_picked_back_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: zmq.Context
) -> None:
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path / "node"))
    env = dict(os.environ)
    root = subprocess.Popen(
        [*TUIMON, "relay", "--root", "--listen", root_address], stderr=subprocess.PIPE, text=True
    )
    node_command = [*TUIMON, "relay", "--upstream", root_address]
    node = subprocess.Popen(node_command, env=env, stderr=subprocess.PIPE, text=True)
    publisher = None
    try:
        assert "viewers connect to " + root_address in (root.stderr.readline() if root.stderr else "")
        assert "forwarding to the root" in (node.stderr.readline() if node.stderr else "")
        publisher = Publisher("cmd", 0, heartbeat_s=0.2)
        viewer = Viewer(context, root_address, subscription("metrics"))
        step = 0

        def publish() -> None:
            nonlocal step
            step += 1
            publisher.publish("metrics", step=step, metrics={"loss": 1.0})
            viewer.read()
            time.sleep(0.02)

        wait_until(
            lambda: viewer.of("metrics"),
            timeout_s=15,
            what="a metric through two relay processes",
            tick=publish,
        )
        node.terminate()
        assert node.wait(timeout=10) == 0, "a relay stops cleanly on SIGTERM"
        before = step
        node = subprocess.Popen(node_command, env=env, stderr=subprocess.PIPE, text=True)
        wait_until(
            lambda: any(m["step"] > before for m in viewer.of("metrics")),
            timeout_s=15,
            what="metrics again after the node relay restarted",
            tick=publish,
        )
    finally:
        if publisher is not None:
            publisher.close()
        for process in (node, root):
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def test_a_root_without_an_address_or_with_an_upstream_is_a_one_line_error() -> None:
    done = subprocess.run([*TUIMON, "relay", "--root"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "needs --listen" in done.stderr and "Traceback" not in done.stderr
    unreachable = "tcp://192.0.2.1:7000"  # TEST-NET-1: no interface of this machine has it
    done = subprocess.run(
        [*TUIMON, "relay", "--listen", unreachable, "--insecure"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and f"cannot listen on {unreachable}" in done.stderr
    env = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent", "TUIMON_KEYS": ""}
    done = subprocess.run(
        [*TUIMON, "relay", "--listen", unreachable], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 2 and "needs CURVE keys" in done.stderr and "`tuimon keys`" in done.stderr


def test_a_relay_heartbeat_is_a_valid_message_the_viewer_keeps_apart_from_runs() -> None:
    from tuimon.sink import Batch
    from tuimon.store import Store

    beat = make_message(
        "relay",
        run="node@n1",
        rank=0,
        host="n1",
        ts=time.time(),
        seq=0,
        role="node",
        listen="tcp://127.0.0.1:5",
        upstream=None,
        publishers=1,
        ranks=[{"run": "r", "rank": 0, "host": "n1"}],
        stats={"in": 3, "out": 3},
    )
    store = Store()
    store.deliver(Batch([decode(encode(beat))], received=1))
    assert store.run_names() == [] and [r["run"] for r in store.relays()] == ["node@n1"]
    assert json.loads(encode(beat))["type"] == "relay"


def test_tuimon_run_with_relay_reaches_the_root_from_start_to_end(
    tmp_path: Path, context: zmq.Context
) -> None:
    """One command per node: `tuimon run --relay ROOT` starts the node relay itself."""
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    root = subprocess.Popen([*TUIMON, "relay", "--root", "--listen", root_address], stderr=subprocess.DEVNULL)
    try:
        viewer = Viewer(context, root_address)
        script = Path(__file__).parent / "scripts" / "plain_train.py"
        env = {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp_path / "node"), "TUIMON_RELAY": root_address}
        env.pop("LOCAL_RANK", None)
        training = subprocess.Popen(
            [
                *TUIMON,
                "run",
                "--run",
                "relayed",
                "--gpu",
                "none",
                "--",
                sys.executable,
                str(script),
                "--steps",
                "400",
                "--step-delay",
                "0.01",
            ],
            env=env,
        )
        wait_until(
            lambda: training.poll() is not None, timeout_s=120, what="the training to end", tick=viewer.read
        )
        assert training.returncode == 0
        wait_until(lambda: viewer.of("run_end"), timeout_s=10, what="run_end at the root", tick=viewer.read)
        metrics = [m for m in viewer.of("metrics") if m["run"] == "relayed"]
        assert metrics and metrics[-1]["step"] == 400, "the node relay found the rank, forwarded to the end"
        assert viewer.of("run_end")[-1]["status"] == "completed"
        assert any(m["run"].startswith("node@") for m in viewer.of("relay")), "the node relay beat"
    finally:
        root.terminate()
        root.wait(timeout=10)


def test_the_dashboard_source_at_the_root_shows_the_focused_rank_with_its_history_and_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tuimon watch ROOT` joins mid-run: the focused rank's snapshot fills in what came before it,
    every rank is known (with its step) from its node's summary, which stands for the others."""
    from tuimon.sources.live import LiveSource

    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    registry, publishers = start_node("nodeA", tmp_path, monkeypatch, range(0, 2))
    for publisher in publishers:
        publisher.publish("run_start", config={}, seed=0, world_size=2)
        for step in range(1, 51):
            publisher.publish("metrics", step=step, metrics={"loss": 1.0 / step})
    # Sent before any relay exists: the viewer can only learn them from a snapshot.
    wait_until(lambda: all(p.stats()["sent"] >= 51 for p in publishers), what="the first 51 messages sent")
    root = Relay(listen=root_address, root=True, heartbeat_s=0.2)
    node = Relay(
        listen="tcp://127.0.0.1:*",
        upstream=root_address,
        registry_dir=registry,
        host="nodeA",
        heartbeat_s=0.2,
    )
    source = LiveSource([root_address])
    step = 50

    def publish() -> None:
        nonlocal step
        step += 1
        for publisher in publishers:
            publisher.publish("metrics", step=step, metrics={"loss": 1.0 / step})
        time.sleep(0.05)

    def focused_history_and_both_ranks() -> bool:
        view = source.store.run_view("job")
        return (
            view is not None
            and len(view.ranks) == 2
            and list(source.store.series("job", "loss", rank=0)[0][:1]) == [1]
        )

    with running(root), running(node):
        source.start()
        try:
            wait_until(
                focused_history_and_both_ranks,
                timeout_s=20,
                what="rank 0 from step 1, both ranks",
                tick=publish,
            )
            wait_until(
                lambda: [r["run"] for r in source.store.relays()] == [node.name, root.name],
                timeout_s=5,
                what="both relays' heartbeats kept apart from the run",
            )
            assert source.store.run_names() == ["job"]
            wait_until(
                lambda: source.store.job_view("job") is not None,
                timeout_s=5,
                what="the node's summary",
                tick=publish,
            )
            assert [node.name for node in source.store.job_view("job").nodes] == ["nodeA"]
            view = source.store.run_view("job")
            assert view is not None and view.gaps == 0, "the relay's numbering is not taken for a rank's"
        finally:
            source.stop()
    for publisher in publishers:
        publisher.close()


@contextlib.contextmanager
def two_node_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, list[Publisher], Relay]]:
    """Nodes A (ranks 0, 1) and B (ranks 2, 3), each with its relay, under a root at the yielded address."""
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    registry_a, node_a = start_node("nodeA", tmp_path, monkeypatch, range(0, 2))
    registry_b, node_b = start_node("nodeB", tmp_path, monkeypatch, range(2, 4))
    root = Relay(listen=root_address, root=True, heartbeat_s=0.5)
    relays = [
        Relay(
            listen="tcp://127.0.0.1:*",
            upstream=root_address,
            registry_dir=registry,
            host=host,
            heartbeat_s=0.5,
        )
        for registry, host in ((registry_a, "nodeA"), (registry_b, "nodeB"))
    ]
    try:
        with running(root), running(relays[0]), running(relays[1]):
            yield root_address, node_a + node_b, root
    finally:
        for publisher in node_a + node_b:
            publisher.close()


def first_event(viewer: Viewer, kind: str) -> dict[str, Any] | None:
    return next((m for m in viewer.of("event") if m["kind"] == kind), None)


def test_a_compute_time_stays_a_ranks_latest_between_timed_steps_but_not_for_good() -> None:
    """A fast rank times one step in many: its node's summaries carry its latest compute time
    between two timed steps, and once no newer one comes for ``KEEP_S`` (its timer failed), none,
    rather than a stale figure the root would judge it on."""
    summarizer = NodeSummarizer("nodeA")

    def step(number: int, now: float, **timed: float) -> float | None:
        metrics = {"loss": 1.0, "step_time": 0.01, **timed}
        summarizer.observe(make_message("metrics", run="job", rank=0, host="nodeA", ts=now, seq=number,
                                        step=number, metrics=metrics), now)
        [(_, _, body)] = summarizer.summaries(now)
        return body["per_rank"]["compute_time"][0]

    assert step(1, 0.0, compute_time=0.004) == pytest.approx(0.004)
    assert step(2, 0.5) == pytest.approx(0.004), "kept between timed steps"
    assert step(3, KEEP_S) == pytest.approx(0.004)
    assert step(4, KEEP_S + 0.5) is None, "not for good"
    assert step(5, KEEP_S + 0.6, compute_time=0.005) == pytest.approx(0.005)


def test_the_root_names_a_data_and_a_compute_straggler_then_a_hung_rank_by_rank_and_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: zmq.Context
) -> None:
    """Each rank's compute time comes on one step in 25, as a Monitor times a fast step at most
    every 50 ms: the compute straggler is still named, from the figures its node's relay keeps."""
    with two_node_job(tmp_path, monkeypatch) as (root_address, publishers, root):
        events = Viewer(context, root_address, subscription("event"))
        summaries = Viewer(context, root_address, subscription("summary"))
        stepping = {publisher.rank: 0 for publisher in publishers}

        def train() -> None:
            for publisher in publishers:
                if publisher.rank not in stepping:
                    continue
                stepping[publisher.rank] += 1
                data_time = 0.012 if publisher.rank == 3 else 0.001  # rank 3's loader is slow
                compute_time = 0.016 if publisher.rank == 1 else 0.004  # rank 1's device is slow
                timed = {"compute_time": compute_time} if stepping[publisher.rank] % 25 == 1 else {}
                publisher.publish(
                    "metrics",
                    step=stepping[publisher.rank],
                    metrics={"loss": 1.0 + publisher.rank, "step_time": 0.02, "data_time": data_time,
                             **timed},
                )
            events.read()
            summaries.read()
            time.sleep(0.02)

        started = time.monotonic()
        wait_until(
            lambda: first_event(events, "straggler"), timeout_s=15, what="a straggler named", tick=train
        )

        def named() -> set[tuple[int, str, str]]:
            return {(e["details"]["rank"], e["details"]["host"], e["details"]["cause"])
                    for e in events.of("event") if e["kind"] == "straggler"}

        wait_until(lambda: len(named()) >= 2, timeout_s=10, what="both stragglers named", tick=train)
        assert time.monotonic() - started < 10
        assert named() == {(3, "nodeB", "data"), (1, "nodeA", "compute")}, "data and compute told apart"
        straggler = next(e for e in events.of("event") if e["kind"] == "straggler" and e["rank"] == 3)
        assert straggler["by"] == root.name
        node_b = next(m for m in reversed(summaries.of("summary")) if m["node"] == "nodeB")
        assert node_b["ranks"] == [2, 3]
        assert (node_b["metrics"]["loss"]["min"], node_b["metrics"]["loss"]["min_rank"]) == (3.0, 2)
        assert (node_b["metrics"]["loss"]["max"], node_b["metrics"]["loss"]["max_rank"]) == (4.0, 3)
        assert node_b["per_rank"]["data_time"] == [0.001, 0.012]

        del stepping[2]  # rank 2's loop stops; its publisher's heartbeats go on
        stopped = time.monotonic()
        wait_until(lambda: first_event(events, "hang"), timeout_s=15, what="a hang named", tick=train)
        hang = first_event(events, "hang")
        assert hang is not None and time.monotonic() - stopped < 10
        assert (hang["details"]["rank"], hang["details"]["host"], hang["details"]["whole_job"]) == (
            2,
            "nodeB",
            False,
        )
        assert not [m for m in events.of("event") if m["kind"] == "hang" and m["details"]["rank"] != 2]
        assert not first_event(events, "rank_lost"), "heartbeats continued: nobody is lost"


LOST_PUBLISHER = """
import time
from publisher.wire.transport import Publisher
publisher = Publisher("job", 4, heartbeat_s=0.5)
step = 0
while True:
    step += 1
    publisher.publish("metrics", step=step, metrics={"loss": 1.0})
    time.sleep(0.02)
"""


def test_a_killed_rank_is_named_lost_with_its_host_and_last_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: zmq.Context
) -> None:
    with two_node_job(tmp_path, monkeypatch) as (root_address, publishers, _):
        events = Viewer(context, root_address, subscription("event"))
        heartbeats = Viewer(context, root_address, subscription("heartbeat", "job", 4))
        env = {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp_path / "nodeB"), "TUIMON_HOST": "nodeB"}
        doomed = subprocess.Popen([sys.executable, "-c", LOST_PUBLISHER], env=env)
        try:

            def beat() -> None:
                for publisher in publishers:
                    publisher.publish("metrics", step=1, metrics={"loss": 1.0})
                events.read()
                heartbeats.read()
                time.sleep(0.05)

            wait_until(
                lambda: heartbeats.of("heartbeat"), timeout_s=15, what="rank 4's heartbeats", tick=beat
            )
            doomed.kill()
            killed = time.monotonic()
            wait_until(lambda: first_event(events, "rank_lost"), timeout_s=15, what="rank 4 lost", tick=beat)
        finally:
            doomed.kill()
            doomed.wait(timeout=10)
        lost = first_event(events, "rank_lost")
        assert lost is not None and time.monotonic() - killed < 10
        assert (lost["details"]["rank"], lost["details"]["host"]) == (4, "nodeB")
        assert lost["details"]["last_step"] >= heartbeats.of("heartbeat")[-1]["step"]
        assert {e["details"].get("rank") for e in events.of("event") if e["kind"] == "rank_lost"} == {4}


def test_a_summary_whose_columns_or_beats_do_not_match_its_ranks_is_refused_alone() -> None:
    from publisher.wire.protocol import ProtocolError

    def summary(**body: Any) -> bytes:
        return encode(make_message("summary", run="r", rank=0, host="n", ts=1.0, seq=0, **body))

    good = {"node": "n", "ranks": [0, 1], "metrics": {"loss": {"min": 1.0, "median": 1.5, "max": 2.0}}}
    assert decode(summary(**good, per_rank={"step_time": [0.1, "nan"]}))["node"] == "n"
    with pytest.raises(ProtocolError, match="one value per rank"):
        decode(summary(**good, per_rank={"step_time": [0.1]}))
    with pytest.raises(ProtocolError, match="ranks"):
        decode(summary(**{**good, "ranks": [-1]}))
    beats = [{"silent_s": 0.2, "in_collective": True}, {"silent_s": 7.5, "stack": ["train.py:12"]}]
    assert decode(summary(**good, beats=beats))["beats"][1]["silent_s"] == 7.5
    with pytest.raises(ProtocolError, match="one object per rank"):
        decode(summary(**good, beats=beats[:1]))
    with pytest.raises(ProtocolError, match="silent_s"):
        decode(summary(**good, beats=[beats[0], {"silent_s": -1}]))
    with pytest.raises(ProtocolError, match="in_collective"):
        decode(summary(**good, beats=[beats[0], {"in_collective": "yes"}]))


def test_through_a_relay_the_viewer_takes_summaries_and_one_focused_rank_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded traffic at any scale: per-step metrics of unfocused ranks never reach the viewer."""
    from tuimon.sources.live import LiveSource

    with two_node_job(tmp_path, monkeypatch) as (root_address, publishers, _):
        source = LiveSource([root_address])
        step = 0

        def train() -> None:
            nonlocal step
            step += 1
            for publisher in publishers:
                publisher.publish("metrics", step=step, metrics={"loss": 1.0, "step_time": 0.02})
            time.sleep(0.02)

        def last_step(rank: int) -> int:
            steps, _ = source.store.series("job", "loss", rank=rank)
            return steps[-1] if steps else 0

        source.start()
        try:
            wait_until(
                lambda: source.subscriptions.job and last_step(0) > 0,
                timeout_s=15,
                what="job mode, rank 0 in focus",
                tick=train,
            )
            wait_until(
                lambda: (
                    source.store.job_view("job") is not None and len(source.store.job_view("job").nodes) == 2
                ),
                timeout_s=10,
                what="both nodes' summaries",
                tick=train,
            )
            settled = {rank: last_step(rank) for rank in range(4)}
            for _ in range(40):
                train()
            assert last_step(0) > settled[0] + 20, "the focused rank's metrics keep coming"
            assert all(last_step(rank) == settled[rank] for rank in (1, 2, 3)), "the others' do not"
            source.focus_rank("job", 3)
            wait_until(
                lambda: last_step(3) > settled[3] + 5,
                timeout_s=10,
                what="rank 3 after focusing it",
                tick=train,
            )
            now_rank_0 = last_step(0)
            for _ in range(40):
                train()
            assert last_step(0) <= now_rank_0 + 2, "rank 0 left the focus"
        finally:
            source.stop()


@pytest.mark.solo  # four training processes on two cores: a straggler is a matter of time
def test_two_torchrun_nodes_under_tuimon_run_relay_name_a_diverging_replica_by_rank_and_host(
    tmp_path: Path, context: zmq.Context
) -> None:
    """A real run: two "nodes" on this machine (own runtime folders and host names), each
    a torchrun group of 2 gloo ranks of one 4-rank job, launched by `tuimon run --relay ROOT`
    (which starts each node's relay); rank 3, on nodeB, drifts from the other replicas, and rank 2,
    also on nodeB, computes slower (its step time is everyone's: the others wait for it)."""
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    root = subprocess.Popen([*TUIMON, "relay", "--root", "--listen", root_address], stderr=subprocess.DEVNULL)
    events = Viewer(context, root_address, subscription("event"))
    beats = Viewer(context, root_address, subscription("heartbeat"))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    script = Path(__file__).parent / "scripts" / "plain_torchrun_ddp.py"
    master_port = free_port(span=2)
    nodes = []
    try:
        for node_rank, host in enumerate(("nodeA", "nodeB")):
            env = {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp_path / host), "TUIMON_HOST": host}
            env.pop("LOCAL_RANK", None)
            command = [
                *TUIMON,
                "run",
                "--run",
                "job",
                "--gpu",
                "none",
                "--relay",
                root_address,
                "--",
                torchrun,
                "--nnodes",
                "2",
                "--node_rank",
                str(node_rank),
                "--nproc_per_node",
                "2",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(master_port),
                str(script),
                "300",
                "--diverge-rank",
                "3",
                "--diverge-at",
                "150",
                "--step-delay",
                "0.02",
                "--slow-rank",
                "2",
                "--slow-by",
                "0.02",
            ]
            nodes.append(
                subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            )

        def diverged() -> dict[str, Any] | None:
            return next((e for e in events.of("event") if e["kind"] == "replica_divergence"), None)

        def read() -> None:
            events.read()
            beats.read()
            time.sleep(0.05)

        wait_until(
            lambda: diverged() is not None, timeout_s=150, what="replica_divergence at the root", tick=read
        )
        event = diverged()
        assert event is not None and 3 in event["details"]["ranks"]
        wait_until(lambda: first_event(events, "straggler"), timeout_s=30, what="a straggler", tick=read)
        stragglers = [e["details"] for e in events.of("event") if e["kind"] == "straggler"]
        assert {(s["rank"], s["host"], s["cause"]) for s in stragglers} == {(2, "nodeB", "compute")}
        assert stragglers[0]["compute_time_s"] > 1.5 * stragglers[0]["least_compute_time_s"]
        hosts = {beat["rank"]: beat["host"] for beat in beats.of("heartbeat") if beat["run"] == "job"}
        assert hosts == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}, "every rank known with its host"
        for node in nodes:
            assert node.wait(timeout=120) == 0, node.stderr.read() if node.stderr else ""
    finally:
        for process in [*nodes, root]:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


def test_a_viewer_joining_a_relay_late_gets_the_jobs_starts_events_and_summaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: zmq.Context
) -> None:
    """The clone pattern one level up: what happened before the viewer came, kept by the root."""
    from tuimon.sources.live import LiveSource

    with two_node_job(tmp_path, monkeypatch) as (root_address, publishers, _):
        # Only to see what has passed the root before the late viewer comes.
        early = Viewer(context, root_address, *(subscription(t) for t in ("event", "summary", "run_start")))

        def train() -> None:
            for publisher in publishers:
                publisher.publish("metrics", step=1, metrics={"loss": 1.0})
            early.read()
            time.sleep(0.05)

        wait_until(
            lambda: {m["node"] for m in early.of("summary")} == {"nodeA", "nodeB"},
            timeout_s=15,
            what="both nodes' summaries through the root",
            tick=train,
        )
        for publisher in publishers:  # the tree is up: these reach the root once
            publisher.publish("run_start", config={"lr": 0.1 * (publisher.rank + 1)}, seed=0, world_size=4)
        publishers[2].publish(
            "event", step=1, kind="loss_spike", severity="warning", message="early", id="2-early", count=1
        )
        wait_until(
            lambda: len(early.of("run_start")) == 4 and early.of("event"),
            timeout_s=10,
            what="the starts and the event through the root",
            tick=train,
        )
        source = LiveSource([root_address])
        source.start()
        try:
            wait_until(
                lambda: any(e.id == "2-early" for e in source.store.events("job")),
                timeout_s=10,
                what="the early event at the late viewer",
            )
            view = source.store.run_view("job")
            assert view is not None and view.run_start is not None and view.world_size == 4

            # Nothing trains any more: the summaries can only come from the root's job state.
            def nodes() -> set[str]:
                view = source.store.job_view("job")
                return {node.name for node in view.nodes} if view else set()

            wait_until(
                lambda: nodes() == {"nodeA", "nodeB"},
                timeout_s=5,
                what="both nodes' summaries from the root's job state",
            )
        finally:
            source.stop()


def test_a_frozen_viewer_slows_neither_the_relays_nor_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: zmq.Context
) -> None:
    """A `tuimon tail` at the root stopped with SIGSTOP (as Ctrl-Z does) while the ranks publish
    hundreds of messages a second: another viewer keeps every message, nothing is dropped at the
    publishers, and the frozen one resumes when continued."""
    import signal

    with two_node_job(tmp_path, monkeypatch) as (root_address, publishers, _):
        out = tmp_path / "frozen.jsonl"
        with out.open("wb") as sink:
            frozen = subprocess.Popen([*TUIMON, "tail", root_address], stdout=sink, stderr=subprocess.DEVNULL)
        watching = Viewer(context, root_address, subscription("metrics", "job", 1))
        step = 0

        def train() -> None:
            nonlocal step
            for _ in range(10):
                step += 1
                for publisher in publishers:
                    publisher.publish("metrics", step=step, metrics={"loss": 1.0, "step_time": 0.01})
            watching.read()
            time.sleep(0.02)

        try:
            wait_until(lambda: watching.of("metrics"), timeout_s=15, what="metrics at the root", tick=train)
            frozen.send_signal(signal.SIGSTOP)
            first = step + 1
            ended = time.monotonic() + 8
            while time.monotonic() < ended:
                train()
            last = step
            wait_until(
                lambda: watching.of("metrics")[-1]["step"] == last,
                timeout_s=10,
                what="the live viewer caught up",
                tick=lambda: (watching.read(), time.sleep(0.02)),
            )
            seen = [m["step"] for m in watching.of("metrics") if m["step"] >= first]
            assert seen == list(range(first, last + 1)), "the live viewer lost nothing while another froze"
            assert all(p.stats()["dropped"] == 0 for p in publishers), "training never waited nor dropped"
            size = out.stat().st_size
            frozen.send_signal(signal.SIGCONT)
            wait_until(
                lambda: out.stat().st_size > size, timeout_s=10, what="the frozen viewer resumes", tick=train
            )
        finally:
            frozen.send_signal(signal.SIGCONT)
            frozen.terminate()
            frozen.wait(timeout=10)


def test_tail_at_the_root_prints_the_job_view_by_default_and_every_ranks_stream_with_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a relay, `tuimon tail` takes what the job view takes (summaries, and rank 0's own
    metrics); `--all` takes every rank's metrics too, for scripts that want them."""
    with two_node_job(tmp_path, monkeypatch) as (root_address, publishers, _), stepping(publishers):
        tails = [
            subprocess.Popen([*TUIMON, "tail", root_address, *extra, "--for", "6"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for extra in ([], ["--all"])
        ]
        outputs = [tail.communicate(timeout=60) for tail in tails]
    (job, job_err), (every, every_err) = outputs
    job_lines = [json.loads(line) for line in job.splitlines()]
    every_lines = [json.loads(line) for line in every.splitlines()]
    assert any(m["type"] == "summary" for m in job_lines), job_err.decode()
    # A viewer takes everything until it hears it is at a relay (its beat), then switches topics;
    # give the switch a second to travel up the tree.
    switched = next(m["ts"] for m in job_lines if m["type"] == "relay") + 1.0
    after = {m["rank"] for m in job_lines if m["type"] == "metrics" and m["ts"] > switched}
    assert after == {0}, "only the focused rank's metrics"
    heard = next(m["ts"] for m in every_lines if m["type"] == "relay") + 1.0
    later = {m["rank"] for m in every_lines if m["type"] == "metrics" and m["ts"] > heard}
    assert later == {0, 1, 2, 3}, every_err.decode()
