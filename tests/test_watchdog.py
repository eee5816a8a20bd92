"""The hang watchdog: heartbeats say how long training has been stalled and, past a threshold, where.

Real processes, real sockets, real recordings: a training loop that sleeps inside a named
function, two gloo ranks of which one is late for an all_reduce, an unmodified script under
``tuimon run``; and the watchdog's adaptive threshold on a real step clock and a real publisher.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.cli import TUIMON
from helpers.ports import free_port
from helpers.publisher_client import Message, receive
from helpers.step_timer import step_ended
from helpers.waiting import wait_until

from publisher.readings.timing import StepTimer
from publisher.threads import stacks
from publisher.threads.watchdog import HangWatchdog
from publisher.wire.protocol import ProtocolError, decode, encode, make_message
from publisher.wire.stall import Stall
from publisher.wire.transport import Publisher

SCRIPTS = Path(__file__).parent / "scripts"
def recorded(path: Path) -> list[Message]:
    return [decode(line) for line in path.read_bytes().splitlines()]


def heartbeats(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m["type"] == "heartbeat"]


# ------------------------------------------------------------------------------ a stalled loop


STALLING_LOOP = """
import time
import torch
from publisher.monitor import Monitor

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
mon = Monitor(model, optimizer, run="stall", gpu="none", endpoint={endpoint!r}, hang_after_s={hang!r})

def train_for(seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        loss = model(torch.randn(32, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.step(loss)
        time.sleep(0.01)

def wait_for_the_shared_disk():
    time.sleep({stall!r})

train_for(1.5)  # the test's SUB joins meanwhile
mon.event("stall_begins", "the loop stops stepping now")
wait_for_the_shared_disk()
train_for(2.5)
mon.close()
"""


def test_a_stalled_loop_shows_where_it_sleeps_until_it_steps_again(tmp_path: Path) -> None:
    hang, stall = 2.0, 5.0
    endpoint = f"ipc://{tmp_path}/pub"
    script = STALLING_LOOP.format(endpoint=endpoint, hang=hang, stall=stall)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.linger = 0
    sub.subscribe(b"")
    sub.connect(endpoint)  # before the publisher binds: ZeroMQ connects once it does
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        live: list[Message] = []
        while not live or live[-1]["type"] != "run_end":
            live.append(receive(sub, timeout_s=15.0))
    finally:
        child.wait(30)
        sub.close()
        context.term()
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""

    begins = next(m for m in live if m["type"] == "event" and m["kind"] == "stall_begins")
    beats = heartbeats(live)
    during = [b for b in beats if b["ts"] > begins["ts"] and b["step"] == begins["step"]]
    after = [b for b in beats if b["step"] > begins["step"]]
    stalled = [b["stalled_s"] for b in during]
    assert len(stalled) >= 3 and stalled == sorted(stalled), f"stalled_s grows while stalled: {stalled}"
    healthy = [b.get("stalled_s", 0) for b in beats if b["ts"] < begins["ts"]]
    assert max(healthy) < 1.0, "healthy steps are no stall"
    with_stack = [b for b in during if "stack" in b]
    assert with_stack, "the stack is reported while stalled"
    first = with_stack[0]
    assert first["ts"] - begins["ts"] <= hang + 2.0, "reported within the threshold + 2 s"
    assert all(b["stall_after_s"] == hang for b in during)
    assert first["stalled_s"] >= hang / 2
    assert all("stack" not in b for b in during if b["stalled_s"] < hang / 2), (
        "read from half the threshold on, not before"
    )
    judged = [b for b in with_stack if b["stalled_s"] >= hang]
    assert judged and all(b["cpu_share"] < 0.2 and b["same_place"] is True for b in judged), (
        "asleep in one place: no CPU"
    )
    assert first["stack"][-1].endswith(" wait_for_the_shared_disk"), first["stack"]
    assert first["in_collective"] is False
    assert after and all("stack" not in b and "in_collective" not in b for b in after), (
        "once the loop steps again, heartbeats carry no stack"
    )
    assert all(b["stalled_s"] < 1.0 for b in after)


# ------------------------------------------------------------------------------ two gloo ranks


def test_the_rank_outside_the_collective_is_told_from_the_ranks_waiting_in_it(tmp_path: Path) -> None:
    """Rank 1 sleeps before an all_reduce that rank 0 has entered: rank 0's heartbeat says it waits
    inside torch.distributed, rank 1's that it is elsewhere, and where."""
    script = SCRIPTS / "monitored_gloo_stall.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(free_port()), "1.0", "4.0"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr

    def stalled_beats(rank: int) -> list[Message]:
        beats = [b for b in heartbeats(recorded(tmp_path / f"rank{rank}.jsonl")) if "stack" in b]
        assert beats, f"rank {rank} reported no stack while stalled"
        assert all(b["rank"] == rank and b["step"] == 20 for b in beats)
        return beats

    waiting = stalled_beats(0)
    assert all(b["in_collective"] is True for b in waiting)
    innermost = waiting[0]["stack"][-1]
    assert "torch/distributed/" in innermost and innermost.endswith(" all_reduce"), waiting[0]["stack"]
    late = stalled_beats(1)
    assert all(b["in_collective"] is False for b in late)
    assert late[0]["stack"][-1].endswith(" rank_one_is_late"), late[0]["stack"]
    assert not any("torch/distributed/" in entry for entry in late[0]["stack"][-3:])


# ------------------------------------------------------------------------------ zero-code mode


def test_tuimon_run_reports_where_an_unmodified_script_stalls(tmp_path: Path) -> None:
    """The default threshold (5 s for a fast loop) under ``tuimon run``, with no code change."""
    prefix = tmp_path / "rec" / "exp"
    done = subprocess.run(
        [*TUIMON, "run", "--run", "zero", "--record", str(prefix), "--gpu", "none", "--",
         sys.executable, str(SCRIPTS / "plain_stalling_train.py"), "7.0"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (recording,) = prefix.parent.glob("exp.rank0.*.jsonl")
    beats = heartbeats(recorded(recording))
    with_stack = [b for b in beats if "stack" in b]
    assert with_stack, [b.get("stalled_s") for b in beats]
    assert all(b["stall_after_s"] == 5.0 for b in with_stack), "the default threshold's floor is 5 s"
    assert all(b["stalled_s"] >= 2.5 for b in with_stack), "read from half the threshold on"
    assert with_stack[0]["stack"][-1].endswith(" wait_for_the_shared_disk")
    assert with_stack[0]["in_collective"] is False
    stall_step = with_stack[0]["step"]
    assert any(b["step"] > stall_step for b in beats), "the run went on stepping after the stall"
    assert all("stack" not in b for b in beats if b["step"] > stall_step)


# ------------------------------------------------------------------------------ adaptive threshold


def slow_but_regular_step(seconds: float) -> None:
    time.sleep(seconds)


def test_the_default_threshold_adapts_to_long_steps(tmp_path: Path) -> None:
    """Steps of 0.5 s, longer than the floor (0.2 s here, 5 s by default): once the typical step
    is known, an adaptive watchdog (10 typical steps) reports nothing; a fixed 0.2 s one, on the
    same steps, reports every step as a stall."""
    timer = StepTimer()
    adaptive = HangWatchdog(timer, floor_s=0.2, wake_s=0.05).start()
    fixed = HangWatchdog(timer, after_s=0.2, wake_s=0.05).start()
    publishers = [
        Publisher(name, heartbeat_s=0.1, record=tmp_path / f"{name}.jsonl", register=False,
                  heartbeat_extra=watchdog.heartbeat_fields)
        for name, watchdog in (("adaptive", adaptive), ("fixed", fixed))
    ]
    adaptive.thread_id = fixed.thread_id = threading.get_ident()
    ticks = []
    for _ in range(6):
        step_ended(timer)
        ticks.append(time.time())
        slow_but_regular_step(0.5)
    for watchdog in (adaptive, fixed):
        watchdog.stop()
    for publisher in publishers:
        publisher.close()
    assert timer.clock.seconds == pytest.approx(0.5, abs=0.1)

    def known(name: str) -> list[Message]:  # heartbeats once the typical step is known
        return [b for b in heartbeats(recorded(tmp_path / f"{name}.jsonl")) if b["ts"] > ticks[1] + 0.01]

    adaptive_beats, fixed_beats = known("adaptive"), known("fixed")
    assert max(b.get("stalled_s", 0) for b in adaptive_beats) > 0.3, "the steps did exceed the floor"
    assert not any("stack" in b for b in adaptive_beats), "slow but regular steps are no stall"
    with_stack = [b for b in fixed_beats if "stack" in b]
    assert len(with_stack) >= 5 and all(b["stalled_s"] >= 0.1 for b in with_stack)
    assert with_stack[0]["stack"][-1].endswith(" slow_but_regular_step")
    assert adaptive.threshold() == pytest.approx(10 * timer.clock.seconds)


# ------------------------------------------------------------------------------ bounds and wire


class Told:
    """A stall listener that keeps what it was told."""

    def __init__(self) -> None:
        self.stalls: list[Stall] = []
        self.pauses: list[float] = []

    def stalled(self, stall: Stall) -> None:
        self.stalls.append(stall)

    def resumed(self, length_s: float) -> None:
        self.pauses.append(length_s)


@pytest.mark.parametrize("worker_counts", ["during the pause", "after the resume"])
def test_a_pause_is_told_its_own_length_however_far_behind_the_step_clock_is(worker_counts: str) -> None:
    """The step worker keeps the step clock, a hand-off (0.1 s) behind the steps, so a short
    threshold can find the step before a pause not yet counted. The pause is still told its own
    length, not that of a step beside it: the clock counts the step later, during the pause, or
    not until after steps resumed."""
    timer, told = StepTimer(), Told()
    watchdog = HangWatchdog(timer, after_s=0.1, wake_s=0.02).start(told)
    watchdog.thread_id = threading.get_ident()
    for _ in range(5):
        step_ended(timer)
        time.sleep(0.005)
    paused_at = time.perf_counter()
    before, timer.last_at = timer.last_at, paused_at  # the training thread's half only
    wait_until(lambda: told.stalls, what="the stall told")
    if worker_counts == "during the pause":
        timer.observe(paused_at, before)
    time.sleep(0.3)
    resumed_at = time.perf_counter()
    timer.last_at = resumed_at
    wait_until(lambda: told.pauses, what="the resume told")
    if worker_counts == "after the resume":
        timer.observe(paused_at, before)
    timer.observe(resumed_at, paused_at)
    watchdog.stop()
    assert told.pauses == [pytest.approx(resumed_at - paused_at, abs=0.002)]
    assert told.pauses[0] > 0.3


def test_a_deep_stack_is_cut_to_its_innermost_frames_within_the_heartbeat_bounds() -> None:
    """200 frames of a function whose name alone is over the entry's length: the innermost frames
    are kept, each entry cut from the left, the whole within the bytes a heartbeat can spare."""
    release = threading.Event()
    name = "a_function_with_a_long_name_" + "x" * 400
    namespace: dict[str, Any] = {"release": release}
    exec(f"def {name}(depth):\n    {name}(depth - 1) if depth else release.wait(10)\n", namespace)
    thread = threading.Thread(target=namespace[name], args=(200,), daemon=True)
    thread.start()
    time.sleep(0.2)
    assert thread.ident is not None
    try:
        stack = stacks.capture(thread.ident)
    finally:
        release.set()
        thread.join(5)
    assert stack is not None and stack.in_collective is False
    entries = stack.entries
    assert entries[0].startswith("… ") and entries[0].endswith("outer frames left out")
    assert entries[-1].endswith(" wait") and entries[-2].endswith(" wait"), "Condition.wait in Event.wait"
    assert entries[-3].startswith("…") and entries[-3].endswith("x" * 200)
    assert len(entries) <= stacks.FRAMES + 1
    assert all(len(entry) <= stacks.ENTRY_CHARS for entry in entries)
    assert len(json.dumps(list(entries), ensure_ascii=False).encode()) <= stacks.STACK_BYTES
    assert stacks.capture(thread.ident) is None, "an ended thread has no stack"


def heartbeat(**fields: Any) -> bytes:
    message = make_message("heartbeat", run="r", rank=0, host="h", ts=1.0, seq=0, step=3,
                           snapshot="tcp://127.0.0.1:1", stats={}, **fields)
    return encode(message)


def test_readers_check_the_stall_fields_and_accept_heartbeats_without_them() -> None:
    assert "stalled_s" not in decode(heartbeat())
    good = decode(heartbeat(stalled_s=7.5, stack=["a.py:1 <module>", "a.py:3 f"], in_collective=False,
                            stall_after_s=5.0, cpu_share=0.0, io_bytes_per_s=0, same_place=True))
    assert good["stack"][-1] == "a.py:3 f" and good["cpu_share"] == 0.0
    for fields, reason in (
        ({"stalled_s": -1.0}, "invalid field"),
        ({"stalled_s": "inf"}, "invalid field"),
        ({"stalled_s": True}, "invalid field"),
        ({"stack": "a.py:1 f"}, "invalid field"),
        ({"stack": [1, 2]}, "invalid field"),
        ({"stack": ["x"] * 65}, "too large"),
        ({"stack": ["x" * 513]}, "too large"),
        ({"in_collective": "yes"}, "invalid field"),
        ({"same_place": 1}, "invalid field"),
        ({"cpu_share": 1.5}, "invalid field"),
        ({"cpu_share": -0.1}, "invalid field"),
        ({"io_bytes_per_s": -1}, "invalid field"),
        ({"workers_cpu": -0.5}, "invalid field"),
        ({"stall_after_s": "5"}, "invalid field"),
    ):
        with pytest.raises(ProtocolError) as caught:
            decode(heartbeat(**fields))
        assert caught.value.reason == reason, fields


def test_a_failing_heartbeat_extra_never_stops_the_heartbeat(tmp_path: Path) -> None:
    calls = []

    def extra() -> dict[str, Any]:
        calls.append(1)
        if len(calls) % 3 == 1:
            raise RuntimeError("broken")
        if len(calls) % 3 == 2:
            return {"stack": ["x" * 500] * 60, "seq": 99}  # over the heartbeat's 16 KiB; seq is not its own
        return {"stalled_s": 1.5, "seq": 99}

    record = tmp_path / "beats.jsonl"
    publisher = Publisher("extra", heartbeat_s=0.05, record=record, register=False, heartbeat_extra=extra)
    deadline = time.monotonic() + 5
    while len(calls) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    publisher.close()
    beats = heartbeats(recorded(record))
    assert len(beats) >= 6 and [b["seq"] for b in beats] == sorted({b["seq"] for b in beats})
    assert any(b.get("stalled_s") == 1.5 for b in beats), "good extra fields are sent"
    assert not any("stack" in b for b in beats)
    assert publisher.heartbeat_extra_failures >= 4


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_a_bad_hang_threshold_fails_at_once(bad: Any) -> None:
    from publisher.monitor import Monitor

    with pytest.raises(ValueError, match="hang_after_s"):
        Monitor(run="bad", gpu="none", hang_after_s=bad)
