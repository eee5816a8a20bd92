"""Relays know every rank from its start: a rank that started before its node relay found it is
complete at the root (its run_start, its events and invariants so far), and a viewer through a
relay counts no gaps in a stream the relays filter for it. Real `tuimon relay` processes, real
publishers, real sockets."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import TUIMON
from helpers.relays import relay_processes, stepping
from helpers.waiting import wait_until

from publisher.wire.transport import Publisher

HOSTS = ("nodeA", "nodeB")


def job_publishers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Publisher]:
    """Ranks 0-1 on nodeA, 2-3 on nodeB, each registered in its node's run registry."""
    publishers = []
    for node, host in enumerate(HOSTS):
        monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path / host))
        ranks = (2 * node, 2 * node + 1)
        publishers += [Publisher("job", rank, host=host, heartbeat_s=0.2) for rank in ranks]
    return publishers


@pytest.fixture
def started_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Publisher]]:
    """The job's four ranks, each having said its start, rank 3 an event and rank 1 an invariant,
    then 20 steps, all before any relay exists."""
    publishers = job_publishers(tmp_path, monkeypatch)
    try:
        for publisher in publishers:
            rank = publisher.rank
            publisher.publish("run_start", config={"lr": 0.1 * (rank + 1)}, seed=rank, world_size=4,
                              argv=["train.py", f"--rank={rank}"])
        publishers[3].publish("event", step=3, kind="loss_spike", severity="warning",
                              message="before the relay", id="3-early", count=1)
        publishers[1].publish("invariant", name="optimizer_changes_params", status="ok", step=2,
                              message="checked")
        for step in range(1, 21):
            for publisher in publishers:
                publisher.publish("metrics", step=step, metrics={"loss": 1.0 / step})
        wait_until(lambda: all(p.stats()["sent"] >= 21 for p in publishers),
                   what="the ranks' first messages sent")
        yield publishers
    finally:
        for publisher in publishers:
            publisher.close()


@pytest.fixture
def training(started_job: list[Publisher]) -> Iterator[list[Publisher]]:
    """The job keeps stepping, 20 steps a second, on a thread."""
    with stepping(started_job, step=20):
        yield started_job


def tail(address: str, seconds: float) -> list[dict[str, Any]]:
    """`tuimon tail ADDRESS --for SECONDS`, each printed line."""
    done = subprocess.run([*TUIMON, "tail", address, "--for", str(seconds)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_ranks_that_started_before_their_node_relay_reach_the_root_with_their_start(
    tmp_path: Path, training: list[Publisher]
) -> None:
    """The issue's job: `tuimon tail` at the root printed rank 0's run_start only."""
    with relay_processes(tmp_path, HOSTS) as root:
        lines = tail(root, 6)
        late = tail(root, 2)  # a second viewer, later: what the root kept for late joiners
    for printed in (lines, late):
        starts = {m["rank"]: m for m in printed if m["type"] == "run_start"}
        assert sorted(starts) == [0, 1, 2, 3], "every rank's start, whenever its relay found it"
        said = {rank: (m["host"], m["config"]["lr"], m["world_size"], m["argv"][1])
                for rank, m in starts.items()}
        assert said == {rank: (HOSTS[rank // 2], pytest.approx(0.1 * (rank + 1)), 4, f"--rank={rank}")
                        for rank in range(4)}
        events = [m for m in printed if m["type"] == "event" and m["id"] == "3-early"]
        said_early = [(e["rank"], e["host"], e["message"]) for e in events[:1]]
        assert said_early == [(3, "nodeB", "before the relay")]
        invariants = [m for m in printed if m["type"] == "invariant"]
        assert {(m["rank"], m["name"], m["status"]) for m in invariants} == {
            (1, "optimizer_changes_params", "ok")
        }


def test_focusing_a_rank_through_relays_counts_no_gaps(tmp_path: Path, started_job: list[Publisher]) -> None:
    """A viewer at the root takes most ranks' messages filtered (the job's topics) and one focused
    rank's whole: moving the focus to rank 3 after hundreds of its messages went by is no loss."""
    from tuimon.sources.live import LiveSource

    step = 20

    def train() -> None:
        nonlocal step
        step += 1
        for publisher in started_job:
            publisher.publish("metrics", step=step, metrics={"loss": 1.0 / step})
        time.sleep(0.01)

    def last_step(rank: int) -> int:
        steps, _ = source.store.series("job", "loss", rank=rank)
        return steps[-1] if len(steps) else 0

    with relay_processes(tmp_path, HOSTS) as root:
        source = LiveSource([root])
        source.start()
        try:
            wait_until(lambda: source.subscriptions.job and last_step(0) > 30, timeout_s=20,
                       what="job mode, rank 0 in focus", tick=train)
            started_job[3].publish("event", step=step, kind="loss_spike", severity="warning", message="heard",
                                   id="3-heard", count=1)
            wait_until(lambda: any(e.id == "3-heard" for e in source.store.events("job")), timeout_s=10,
                       what="rank 3's event, through the job's topics", tick=train)
            for _ in range(200):
                train()  # rank 3's metrics go by unseen
            source.focus_rank("job", 3)
            focused_at = last_step(3)
            wait_until(lambda: last_step(3) > max(focused_at, step - 5), timeout_s=15,
                       what="rank 3's metrics after focusing it", tick=train)
            assert source.store.counters().gaps == 0
            view = source.store.run_view("job")
            assert view is not None and view.gaps == 0, "a filtered stream has no gaps"
        finally:
            source.stop()
