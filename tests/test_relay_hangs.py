"""A stalled job through relays: the rank outside the collective is named first, with its host and
function; the ranks waiting in the collective are said to wait for it, never called hung; and what
a rank's own publisher already says is not said again by the root (tuimon/relay/watch.py, "One
verdict per stall"). Real `tuimon relay` processes, real publishers whose heartbeats carry what a
rank's watchdog reads (docs/protocol.md, `heartbeat`), real sockets."""

from __future__ import annotations

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
from helpers.cli import SCRIPTS, TUIMON
from helpers.relays import relay_processes
from helpers.waiting import wait_until

from publisher.wire import stall
from publisher.wire.protocol import decode
from publisher.wire.topics import subscription
from publisher.wire.transport import Publisher

HOSTS = ("nodeA", "nodeB")
#: Where the ranks are when they stop: rank 2 reads its data, the others wait in the all-reduce.
FETCHING = ["/home/u/train.py:60 <module>", "/home/u/train.py:40 train", "/home/u/train.py:4 fetch_batch"]
WAITING = ["/home/u/train.py:60 <module>", "/home/u/train.py:44 train",
           "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:81 wrapper",
           "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2800 all_reduce"]


class Rank:
    """A rank's publisher whose heartbeats say what its watchdog would: seconds since its last
    step, and from half the threshold on its stack, whether it is in a collective and (a publisher
    that judges itself) its threshold and that it is blocked in one place using no CPU."""

    def __init__(self, rank: int, host: str, judges_itself: bool) -> None:
        self.judges_itself = judges_itself
        self.stack: list[str] = []
        self.last_step_at = time.monotonic()
        self.step = 0
        self.publisher = Publisher("job", rank, host=host, heartbeat_s=0.25, heartbeat_extra=self.watchdog)

    @property
    def threshold(self) -> float:
        return 2.0 if self.judges_itself else stall.FLOOR_S

    def watchdog(self) -> dict[str, Any]:
        stalled = time.monotonic() - self.last_step_at
        fields: dict[str, Any] = {"stalled_s": round(stalled, 3)}
        if self.judges_itself:
            fields["stall_after_s"] = self.threshold
        if self.stack and stalled >= stall.CAPTURE_FROM * self.threshold:
            fields |= {"stack": self.stack, "in_collective": self.stack is WAITING}
            if self.judges_itself:
                fields |= {"cpu_share": 0.0, "io_bytes_per_s": 0, "same_place": True}
        return fields

    def train(self) -> None:
        if self.stack:
            return
        self.step += 1
        self.last_step_at = time.monotonic()
        self.publisher.publish("metrics", step=self.step, metrics={"loss": 1.0, "step_time": 0.05})


@pytest.fixture
def job(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[Rank]]:
    """Ranks 0-1 on nodeA, 2-3 on nodeB; ``judges_itself`` from the test's parameter."""
    ranks = []
    for node, host in enumerate(HOSTS):
        monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path / host))
        ranks += [Rank(number, host, request.param) for number in (2 * node, 2 * node + 1)]
    try:
        yield ranks
    finally:
        for rank in ranks:
            rank.publisher.close()


class Events:
    """The events at the root, as a viewer subscribed to them receives them, with when they came."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        self.sub = context.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.subscribe(subscription("event"))
        self.sub.connect(address)
        self.heard: list[tuple[float, dict[str, Any]]] = []

    def read(self) -> None:
        while self.sub.poll(0):
            self.heard.append((time.monotonic(), decode(self.sub.recv())))

    def first(self, kind: str, severity: str | None = None) -> tuple[float, dict[str, Any]] | None:
        return next(((at, e) for at, e in self.heard
                     if e["kind"] == kind and severity in (None, e["severity"])), None)

    def loud(self) -> list[dict[str, Any]]:
        """Warnings and worse."""
        return [e for _, e in self.heard if e["severity"] != "info"]


def stall_job(
    job: list[Rank], context: zmq.Context, root: str, stacks: dict[int, list[str]]
) -> tuple[Events, float]:
    """Train until the root hears every rank, then stop each rank where ``stacks`` says; the root's
    events, and when the ranks stopped."""
    events = Events(context, root)
    summaries = context.socket(zmq.SUB)
    summaries.linger = 0
    summaries.subscribe(subscription("summary"))
    summaries.connect(root)
    heard: set[int] = set()

    def train() -> None:
        for rank in job:
            rank.train()
        while summaries.poll(0):
            heard.update(decode(summaries.recv())["ranks"])
        events.read()
        time.sleep(0.05)

    wait_until(lambda: heard == {0, 1, 2, 3}, timeout_s=20, what="every rank in the root's summaries",
               tick=train)
    for _ in range(20):
        train()  # the relay sees steps advance at the job's pace
    for rank in job:
        rank.stack = stacks[rank.publisher.rank]
    return events, time.monotonic()


@pytest.mark.parametrize("job", [False], indirect=True, ids=["older-publishers"])
def test_a_rank_that_does_not_judge_itself_is_named_by_the_root_first_the_waiting_ranks_never(
    job: list[Rank], tmp_path: Path, context: zmq.Context
) -> None:
    """The issue's job through relays: rank 2 asleep in its data fetch, the others in the
    all-reduce; its publisher does not judge its own stalls (no ``stall_after_s``), so the root does."""
    with relay_processes(tmp_path, HOSTS) as root:
        events, stopped = stall_job(job, context, root, {0: WAITING, 1: WAITING, 2: FETCHING, 3: WAITING})
        wait_until(lambda: events.first("hang"), timeout_s=15, what="a hang at the root",
                   tick=lambda: (events.read(), time.sleep(0.05)))
        end = time.monotonic() + 3
        while time.monotonic() < end:  # what else the root says meanwhile
            events.read()
            time.sleep(0.05)
    named = events.first("hang")
    assert named is not None
    at, hang = named
    assert at - stopped < 10, "named within 10 s of the stall"
    assert (hang["rank"], hang["host"], hang["severity"]) == (2, "nodeB", "warning")
    details = hang["details"]
    assert (details["where"], details["stack"]) == ("fetch_batch (train.py:4)", FETCHING), "with its function"
    assert "rank 2 on nodeB stuck" in hang["message"] and "fetch_batch (train.py:4)" in hang["message"]
    assert (details["waiting_ranks"], details["waiting"]) == ([0, 1, 3], 3)
    assert details["waiting_in"] == "all_reduce (distributed_c10d.py:2800)"
    assert {e["rank"] for e in events.loud()} == {2}, "the waiting ranks are never called hung"


@pytest.mark.parametrize("job", [True], indirect=True, ids=["judging-publishers"])
def test_a_rank_that_judges_itself_is_not_judged_again_the_root_says_who_waits_for_it(
    job: list[Rank], tmp_path: Path, context: zmq.Context
) -> None:
    """Publishers that judge their own stalls send their own `hang` (its first warning names it);
    the root adds only what no rank knows: who waits for it, as information."""
    with relay_processes(tmp_path, HOSTS) as root:
        events, stopped = stall_job(job, context, root, {0: WAITING, 1: WAITING, 2: FETCHING, 3: WAITING})
        wait_until(lambda: events.first("collective_wait"), timeout_s=15, what="the root's collective_wait",
                   tick=lambda: (events.read(), time.sleep(0.05)))
        end = time.monotonic() + 3
        while time.monotonic() < end:
            events.read()
            time.sleep(0.05)
    named = events.first("collective_wait")
    assert named is not None
    at, wait = named
    assert at - stopped < 10
    assert (wait["rank"], wait["host"], wait["severity"], wait["by"]) == (2, "nodeB", "info", "root@login1")
    assert wait["details"]["where"] == "fetch_batch (train.py:4)"
    assert wait["details"]["waiting_ranks"] == [0, 1, 3]
    assert wait["message"].startswith(
        "3 ranks (0-1, 3) wait in all_reduce (distributed_c10d.py:2800) for rank 2 on nodeB, stuck"
    )
    assert not events.loud(), "the stuck rank's own hang is the verdict: the root does not repeat it"


@pytest.mark.parametrize("job", [True], indirect=True, ids=["judging-publishers"])
def test_when_every_rank_waits_in_the_collective_the_root_says_the_job_hangs(
    job: list[Rank], tmp_path: Path, context: zmq.Context
) -> None:
    """No rank is outside the collective (a network or NCCL hang): each rank only says it waits,
    so the root is the one to warn, once, about the job."""
    with relay_processes(tmp_path, HOSTS) as root:
        events, stopped = stall_job(job, context, root, dict.fromkeys(range(4), WAITING))
        wait_until(lambda: events.first("hang"), timeout_s=15, what="the job's hang",
                   tick=lambda: (events.read(), time.sleep(0.05)))
    named = events.first("hang")
    assert named is not None
    at, hang = named
    assert at - stopped < 10
    assert (hang["rank"], hang["severity"], hang["details"]["whole_job"]) == (0, "warning", True)
    assert hang["message"].startswith("every rank (0-3) waits in all_reduce (distributed_c10d.py:2800)")
    assert {e["rank"] for e in events.loud()} == {0} and not events.first("collective_wait")


def test_a_gloo_job_under_tuimon_run_relay_names_the_blocked_rank_first_and_once(tmp_path: Path) -> None:
    """The issue's job, for real: two gloo ranks under `tuimon run --relay` (which starts the node
    relay), rank 1 asleep in its data fetch while rank 0 waits in the all-reduce, watched at the
    root with `tuimon tail`. The first warning is rank 1's own, with its host and function in
    words; rank 0 is only said to wait; the root says who waits for rank 1 and repeats no verdict."""
    with relay_processes(tmp_path, ()) as root:
        tailed = tmp_path / "tail.jsonl"
        with tailed.open("wb") as lines:
            tail = subprocess.Popen([*TUIMON, "tail", root], stdout=lines, stderr=subprocess.DEVNULL)
        env = {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp_path / "nodeA"), "TUIMON_HOST": "nodeA"}
        env.pop("LOCAL_RANK", None)
        command = [*TUIMON, "run", "--run", "gloo", "--gpu", "none", "--relay", root, "--",
                   sys.executable, str(SCRIPTS / "plain_gloo_blocked_rank.py"), str(tmp_path / "init"), "12",
                   "manual"]
        out, err = tmp_path / "out.txt", tmp_path / "err.txt"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            training = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr)
        try:
            wait_until(lambda: training.poll() is not None, timeout_s=150, what="the training to end",
                       tick=lambda: time.sleep(0.1))
            time.sleep(2)
        finally:
            for process in (training, tail):
                if process.poll() is None:
                    process.terminate()
                process.wait(timeout=30)
    assert training.returncode == 0, err.read_text(errors="replace")[-2000:]
    printed = out.read_text().splitlines()
    blocked_at = next(float(line.split()[1]) for line in printed if line.startswith("BLOCK"))
    events = [m for m in map(json.loads, tailed.read_text().splitlines()) if m["type"] == "event"]
    loud = [e for e in events if e["severity"] != "info"]
    assert loud, json.dumps(events, indent=1)[:4000]
    first = loud[0]
    assert (first["kind"], first["rank"], first["host"]) == ("hang", 1, "nodeA"), first
    assert "by" not in first, "the rank's own verdict"
    assert first["ts"] - blocked_at < 10, "named within 10 s of the stall"
    assert first["details"]["where"].startswith("fetch_shard (plain_gloo_blocked_rank.py:")
    assert first["message"].startswith("rank 1 stuck for ") and "in fetch_shard (" in first["message"]
    assert {(e["kind"], e["rank"]) for e in loud} == {("hang", 1)}, "rank 0 waits: it is never called hung"
    assert not [e for e in loud if "by" in e], "the root repeats no verdict"
    said = [e for e in events if e["kind"] == "collective_wait" and e.get("by")]
    assert said and said[0]["rank"] == 1 and said[0]["details"]["waiting_ranks"] == [0]
    words = said[0]["message"]
    assert words.startswith("rank 0 waits in all_reduce (") and "for rank 1 on nodeA, stuck" in words
