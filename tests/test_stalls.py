"""A stall is an event of the rank itself: stuck, busy or waiting in a collective, named where it is.

The one definition (:mod:`publisher.wire.stall`) on heartbeat fields; the stall events
(:mod:`publisher.detectors.stall_events`) on a real episode tracker; and real processes: a plain script
under ``tuimon run`` watched by ``tuimon tail`` (with an alert command), two gloo ranks on one node
without a relay (DDP and a hand-written all-reduce), a healthy run with a slow first step,
validation passes and a checkpoint write, and the watchdog's cost while healthy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import SCRIPTS, TUIMON
from helpers.step_timer import step_ended

from publisher.detectors.episodes import EpisodeTracker
from publisher.detectors.stall_events import StallEvents
from publisher.readings.timing import StepTimer
from publisher.threads.thread_usage import ThreadUsage, native_id
from publisher.threads.watchdog import HangWatchdog
from publisher.wire import stall
from publisher.wire.stall import BUSY, OK, STUCK, WAITING, judge

#: The named frame must come within this many seconds of the stall's start (the issue's target).
NAMED_WITHIN_S = 10.0
STACK = [
    "… 2 outer frames left out",
    "/home/me/train.py:40 <module>",
    "/home/me/train.py:12 fetch_batch",
    "/usr/lib/python3.11/threading.py:320 wait",
    "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:1133 _get_data",
]


# ------------------------------------------------------------------------------ the one definition


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({"stalled_s": 4.9}, OK),
        ({"stalled_s": 6.0, "in_collective": True, "cpu_share": 0.0}, WAITING),
        ({"stalled_s": 6.0, "in_collective": True, "cpu_share": 1.0}, WAITING),  # NCCL spins
        ({"stalled_s": 6.0, "in_collective": False, "cpu_share": 0.01, "io_bytes_per_s": 0,
          "same_place": True}, STUCK),
        ({"stalled_s": 6.0, "cpu_share": 0.97, "same_place": True}, BUSY),  # one long call
        ({"stalled_s": 6.0, "cpu_share": 0.05, "io_bytes_per_s": 50e6}, BUSY),  # a checkpoint write
        ({"stalled_s": 6.0, "cpu_share": 0.05, "io_bytes_per_s": 100, "same_place": False}, BUSY),
        ({"stalled_s": 6.0, "same_place": True}, STUCK),  # no CPU figures: a stack that stays
        ({"stalled_s": 6.0}, STUCK),  # an older publisher's heartbeat: a stall as it always was
        ({"stalled_s": 6.0, "cpu_share": "lots", "same_place": "yes"}, STUCK),  # junk is unknown
    ],
)
def test_the_verdict_comes_from_the_heartbeat_fields(fields: dict[str, Any], state: str) -> None:
    assert judge({**fields, "stall_after_s": 5.0, "stack": STACK}).state == state


def test_waiting_for_dataloader_workers_that_work_is_waiting_for_data() -> None:
    """An epoch's workers starting slowly: the training thread waits in the DataLoader's queue with
    no CPU of its own while its workers use some. Workers that use none (one hung) leave it stuck,
    and busy child processes do not excuse a thread blocked anywhere else."""
    waiting = [
        "/home/me/train.py:40 <module>",
        "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:1280 _try_get_data",
        "/usr/lib/python3.11/multiprocessing/queues.py:113 get",
        "/usr/lib/python3.11/multiprocessing/connection.py:257 poll",
        "/usr/lib/python3.11/selectors.py:415 select",
    ]
    fields = {"stalled_s": 6.0, "stall_after_s": 5.0, "cpu_share": 0.0, "io_bytes_per_s": 0}
    assert judge({**fields, "stack": waiting, "workers_cpu": 1.6}).state == BUSY
    assert judge({**fields, "stack": waiting, "workers_cpu": 0.0}).state == STUCK
    assert judge({**fields, "stack": waiting}).state == STUCK
    assert judge({**fields, "stack": STACK[:3], "workers_cpu": 1.6}).state == STUCK


def test_a_stall_is_named_by_the_users_innermost_frame_and_the_innermost_overall() -> None:
    verdict = judge({"stalled_s": 12.4, "stall_after_s": 5.0, "stack": STACK, "cpu_share": 0.0})
    assert verdict.where == "fetch_batch (train.py:12)"
    assert verdict.innermost == "_get_data (dataloader.py:1133)"
    assert verdict.describe() == "stuck 12 s in fetch_batch (train.py:12)"
    project = str(Path(stall.__file__).resolve().parents[1])  # tuimon's own wrappers are not the user's
    wrapped = [*STACK[:3], f"{project}/readings/timing.py:55 track", "<frozen importlib._bootstrap>:1 _load"]
    assert judge({"stalled_s": 6, "stack": wrapped}).where == "fetch_batch (train.py:12)"
    script = judge({"stalled_s": 6, "stack": ["<string>:4 wait_for_disk"]})  # python -c
    assert script.where == "wait_for_disk (<string>:4)"
    waiting = judge({"stalled_s": 7, "in_collective": True, "stack": [
        "/home/me/train.py:30 train_step",
        "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2800 all_reduce",
    ]})
    assert waiting.describe() == "waiting 7 s in all_reduce (distributed_c10d.py:2800)"
    assert judge({"stalled_s": 3.0}).describe() == "stalled 3 s"
    assert judge({"stalled_s": 9.0, "stall_after_s": 10.0}).state == OK, "the publisher's own threshold"
    assert judge({"stalled_s": 9.0, "stall_after_s": 10.0}, threshold=5.0).state == STUCK, "or the caller's"


def test_the_threshold_adapts_to_the_typical_step() -> None:
    assert stall.threshold_s(None) == stall.FLOOR_S == 5.0
    assert stall.threshold_s(0.05) == 5.0
    assert stall.threshold_s(3.0) == 30.0
    assert stall.threshold_s(3.0, after_s=2.0) == 2.0
    assert stall.pause_s(3.0) == 15.0


def test_how_loud_each_state_is() -> None:
    def severity(state_fields: dict[str, Any], stalled_s: float, longest: float | None = None) -> str | None:
        return judge({**state_fields, "stalled_s": stalled_s, "stall_after_s": 5.0}).severity(longest)

    stuck, busy, waiting = {"cpu_share": 0.0}, {"cpu_share": 1.0}, {"in_collective": True}
    assert severity(stuck, 5.0) == "warning" and severity(stuck, 19.9) == "warning"
    assert severity(stuck, 20.0) == "critical", "4 thresholds"
    assert severity(waiting, 5.0) == severity(waiting, 600.0) == "info", "waiting is never a hang"
    assert severity(busy, 5.0) == "info", "the first pause of a run is noted"
    assert severity(busy, 8.0, longest=8.0) is None, "a pause like an earlier one is not"
    assert severity(busy, 12.0, longest=8.0) == "info", "half again as long as any before is"
    assert severity(busy, 49.0) == "info" and severity(busy, 50.0) == "warning", "10 thresholds"
    assert severity(busy, 79.0, longest=8.0) == "info" and severity(busy, 80.0, longest=8.0) == "warning"
    assert severity({}, 4.0) is None


# ------------------------------------------------------------------------------ stall events


def events_of(tracker_events: list[tuple[int | None, dict[str, Any]]]) -> list[tuple[str, str, str, int]]:
    return [(body["id"], body["kind"], body["severity"], body["count"]) for _, body in tracker_events]


def test_a_stall_is_one_episode_that_escalates_and_closes_with_its_length() -> None:
    sent: list[tuple[int | None, dict[str, Any]]] = []
    events = StallEvents(EpisodeTracker(lambda step, body: sent.append((step, body)), min_update_s=0.0),
                         rank=1, world_size=2, current_step=lambda: 41)
    for seconds in (5.0, 6.0, 20.0):
        events.stalled(judge({"stalled_s": seconds, "stall_after_s": 5.0, "stack": STACK, "cpu_share": 0.0,
                              "same_place": True}))
    events.resumed(21.3)
    assert events_of(sent) == [("0-0", "hang", "warning", 1), ("0-0", "hang", "warning", 2),
                               ("0-0", "hang", "critical", 3), ("0-0", "hang", "critical", 4)]
    first, last = sent[0][1], sent[-1][1]
    assert first["message"].startswith("rank 1 stuck for 5 s in fetch_batch (train.py:12): blocked (0% CPU")
    assert "rank 1 is outside any collective, so the other ranks wait for it" in first["message"], (
        "the culprit says so in its first warning"
    )
    assert first["details"]["stack"] == STACK and first["details"]["where"] == "fetch_batch (train.py:12)"
    assert last["latest"]["details"]["resumed"] is True and last["latest"]["details"]["paused_s"] == 21.3
    assert last["latest"]["message"].endswith("steps resumed after 21.3 s")
    events.stalled(judge({"stalled_s": 5.0, "stall_after_s": 5.0, "cpu_share": 0.0}))
    assert sent[-1][1]["id"] == "0-1", "the next stall is an episode of its own"


def test_a_periodic_busy_pause_is_noted_once_and_a_thread_leaving_its_stall_is_no_new_state() -> None:
    sent: list[tuple[int | None, dict[str, Any]]] = []
    events = StallEvents(EpisodeTracker(lambda step, body: sent.append((step, body)), min_update_s=0.0),
                         rank=0, world_size=1, current_step=lambda: 60)
    busy = {"stall_after_s": 5.0, "cpu_share": 0.99, "stack": ["/home/me/train.py:20 validate"]}
    for _ in range(3):  # a validation pass of 8 s, three times
        for seconds in (5.0, 6.0, 7.0, 8.0):
            events.stalled(judge({**busy, "stalled_s": seconds}))
        events.resumed(8.0)
    assert {(kind, severity) for _, kind, severity, _ in events_of(sent)} == {("busy_pause", "info")}
    assert len({body["id"] for _, body in sent}) == 1, "noted the first time only"
    assert sent[0][1]["message"] == (
        "training paused for 5 s, busy in validate (train.py:20) (99% CPU): the first pause of the run"
    )
    sent.clear()
    stuck = {"stall_after_s": 5.0, "cpu_share": 0.0, "stack": STACK, "same_place": True}
    events.stalled(judge({**stuck, "stalled_s": 5.0}))
    leaving = {"stall_after_s": 5.0, "cpu_share": 0.0, "same_place": False,
               "stack": ["/home/me/train.py:44 train_step"]}
    events.stalled(judge({**leaving, "stalled_s": 6.0}))  # on its way to the next step: moving
    events.resumed(6.2)
    assert [kind for _, kind, _, _ in events_of(sent)] == ["hang", "hang"]
    assert sent[-1][1]["details"]["where"] == "fetch_batch (train.py:12)", "where it was stuck"


# ------------------------------------------------------------------------------ real processes


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp_path / "runtime"), "PYTHONUNBUFFERED": "1"}


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _events(messages: list[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == "event" and (kind is None or m["kind"] == kind)]


def _block_at(stdout: str) -> float:
    return float(next(line.split()[1] for line in stdout.splitlines() if line.startswith("BLOCK ")))


def test_one_process_a_blocked_fetch_is_named_within_10_s_in_tail_alerts_and_the_recording(
    tmp_path: Path,
) -> None:
    """The way most people watch: ``tuimon run`` and ``tuimon tail`` (with an alert command), no relay."""
    env, prefix, alerts = _env(tmp_path), tmp_path / "rec" / "blocked", tmp_path / "alerts.jsonl"
    append = "import sys; open(sys.argv[1], 'ab').write(sys.stdin.buffer.read() + b'\\n')"
    with (tmp_path / "tail.jsonl").open("wb") as out:
        tail = subprocess.Popen(
            [*TUIMON, "tail", "--notify-cmd", shlex.join([sys.executable, "-c", append, str(alerts)])],
            stdout=out, stderr=subprocess.DEVNULL, env=env,
        )
        try:
            done = subprocess.run(
                [*TUIMON, "run", "--run", "blocked", "--record", str(prefix), "--gpu", "none", "--",
                 sys.executable, str(SCRIPTS / "plain_blocked_fetch.py"), "12"],
                capture_output=True, text=True, timeout=120, env=env,
            )
            time.sleep(1.0)
        finally:
            tail.send_signal(signal.SIGTERM)
            tail.wait(30)
    assert done.returncode == 0, done.stderr[-3000:]
    block_at = _block_at(done.stdout)
    (recording,) = prefix.parent.glob("blocked.rank0.*.jsonl")
    recorded = _read(recording)
    tailed = [m for m in _read(tmp_path / "tail.jsonl") if m.get("run") == "blocked"]

    hangs = _events(tailed, "hang")
    assert hangs, [m["kind"] for m in _events(tailed)]
    first, last = hangs[0], hangs[-1]
    print(f"\none process: named {first['ts'] - block_at:.1f} s into the stall")  # pytest -s
    assert first["severity"] == "warning" and first["ts"] - block_at <= NAMED_WITHIN_S
    assert re.search(r"^training stuck for \d+ s in fetch_batch \(plain_blocked_fetch.py:22\): blocked",
                     first["message"]), first["message"]
    assert first["details"]["where"] == "fetch_batch (plain_blocked_fetch.py:22)"
    assert first["details"]["in_collective"] is False and first["details"]["cpu_share"] < 0.2
    assert last["latest"]["details"]["resumed"] is True and last["id"] == first["id"]
    assert last["latest"]["details"]["paused_s"] == pytest.approx(12.0, abs=1.5)
    in_recording = [(m["id"], m["count"]) for m in _events(recorded, "hang")]
    assert in_recording == [(m["id"], m["count"]) for m in hangs], "the recording has what tail printed"
    alarms = {(m["kind"], m["severity"]) for m in _events(recorded) if m["severity"] != "info"}
    assert alarms == {("hang", "warning")}, "nothing else is alarmed: the pause is no slowdown"
    wait = time.monotonic() + 10
    while not alerts.exists() and time.monotonic() < wait:
        time.sleep(0.2)
    (alert,) = [json.loads(line) for line in alerts.read_bytes().splitlines() if line.strip()]
    assert alert["kind"] == "hang" and alert["id"] == first["id"], "alerted once, at its first warning"


GLOO_MODES = ("ddp", "manual")


@pytest.fixture(scope="module")
def gloo_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, float, Path]]:
    """Both jobs of two gloo ranks, run side by side (each mostly waits out its 8 s stall, so the
    pair takes the time of one): per mode, what it printed on stderr, when rank 1 blocked, and
    the prefix of its recordings."""
    jobs = {}
    for mode in GLOO_MODES:
        folder = tmp_path_factory.mktemp(f"gloo-{mode}")
        prefix = folder / "rec" / "gloo"
        jobs[mode] = prefix, subprocess.Popen(
            [*TUIMON, "run", "--run", "gloo", "--record", str(prefix), "--gpu", "none", "--", sys.executable,
             str(SCRIPTS / "plain_gloo_blocked_rank.py"), str(folder / "init"), "8", mode],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(folder),
        )
    done = {}
    for mode, (prefix, job) in jobs.items():
        stdout, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr[-3000:]
        done[mode] = stderr, _block_at(stdout), prefix
    return done


@pytest.mark.parametrize("mode", GLOO_MODES)
def test_two_gloo_ranks_without_a_relay_name_the_blocked_rank_and_never_call_the_waiting_one_hung(
    gloo_jobs: dict[str, tuple[str, float, Path]], mode: str
) -> None:
    """Rank 1's data fetch blocks for 8 s outside any collective; rank 0 waits for it in the
    gradient all-reduce (inside ``loss.backward()`` with DDP, in ``dist.all_reduce`` by hand)."""
    _, block_at, prefix = gloo_jobs[mode]
    ranks = {int(path.name.split(".rank")[1].split(".")[0]): _read(path)
             for path in prefix.parent.glob("gloo.*")}
    assert set(ranks) == {0, 1}

    culprit = _events(ranks[1], "hang")
    assert culprit and culprit[0]["severity"] == "warning", [m["kind"] for m in _events(ranks[1])]
    print(f"\ntwo gloo ranks ({mode}): rank 1 named {culprit[0]['ts'] - block_at:.1f} s into the stall")
    assert culprit[0]["ts"] - block_at <= NAMED_WITHIN_S
    assert culprit[0]["details"]["where"].startswith("fetch_shard (plain_gloo_blocked_rank.py:")
    assert "rank 1 is outside any collective" in culprit[0]["message"]
    assert culprit[-1]["latest"]["details"]["resumed"] is True

    waiting = _events(ranks[0])
    assert not [m for m in waiting if m["kind"] == "hang" or m["severity"] != "info"], waiting
    notes = [m for m in waiting if m["kind"] == "collective_wait"]
    assert notes and notes[0]["details"]["in_collective"] is True
    assert "this rank is not stuck itself" in notes[0]["message"]


def test_a_slow_first_step_validations_a_checkpoint_and_slow_workers_raise_no_warning(tmp_path: Path) -> None:
    recording = tmp_path / "pauses.jsonl"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "monitored_healthy_pauses.py"), str(recording), str(tmp_path)],
        capture_output=True, text=True, timeout=150, env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    messages = _read(recording)
    # Other processes taking this machine's CPUs for 10 s of steps is named whatever the run does
    # (the machine, not the pauses: the pause's own reading is left out, test_detectors.py).
    alarms = [(m["kind"], m["message"]) for m in _events(messages)
              if m["severity"] != "info" and m["details"].get("test") != "cpu contention"]
    assert alarms == []
    pauses = [m for m in messages if m["type"] == "metrics" and m["metrics"].get("step_time", 0) > 2.5]
    assert len(pauses) >= 5, "the first step, two validation passes, the workers' start, the checkpoint"
    noted = {m["id"] for m in _events(messages, "busy_pause")}
    assert len(noted) <= 2, "a pause like an earlier one is not noted again"


def test_a_sleeping_thread_uses_nothing_a_busy_one_wants_a_cpu_a_writer_moves_bytes(tmp_path: Path) -> None:
    """What the watchdog reads of another thread (:mod:`publisher.threads.thread_usage`), over
    1 s of real threads of this process: its CPU share and I/O."""
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("no per-thread scheduler statistics here")

    def spin(until: float) -> None:
        while time.perf_counter() < until:
            pass

    def write(until: float) -> None:
        with (tmp_path / "shard.bin").open("wb") as out:
            while time.perf_counter() < until:
                out.write(b"\0" * (1 << 20))
                time.sleep(0.01)

    def used(work: Any) -> tuple[float, int]:
        done = threading.Event()
        thread = threading.Thread(target=lambda: (work(time.perf_counter() + 1.0), done.wait(5)))
        thread.start()
        assert thread.ident is not None
        tid = native_id(thread.ident)
        assert tid is not None and tid == thread.native_id
        reader = ThreadUsage(tid)
        before, started = reader.read(), time.perf_counter()
        time.sleep(1.0)
        cpu, moved = reader.read().since(before)
        span = time.perf_counter() - started
        done.set()
        thread.join()
        assert cpu is not None and moved is not None
        return cpu / span, round(moved / span)

    asleep = used(lambda until: time.sleep(until - time.perf_counter()))
    assert asleep[0] < 0.05 and asleep[1] == 0
    busy = used(spin)
    assert busy[0] > 0.5, "running or waiting for a CPU: it wants one"
    writing = used(write)
    assert writing[1] > 10 * stall.STUCK_IO_BYTES_PER_S


def test_the_watchdog_wakes_about_once_a_second_while_training_is_healthy() -> None:
    """Its thread's timeslices (Linux schedstat) over 4 s of 10 ms steps: one wake a second."""
    timer = StepTimer()
    watchdog = HangWatchdog(timer).start()
    thread = watchdog._thread
    assert thread is not None and thread.native_id is not None
    path = Path(f"/proc/self/task/{thread.native_id}/schedstat")
    if not path.exists():
        pytest.skip("no schedstat here")
    watchdog.thread_id = threading.get_ident()
    step_ended(timer)
    before = int(path.read_text().split()[2])
    until = time.monotonic() + 4.0
    while time.monotonic() < until:
        time.sleep(0.01)
        step_ended(timer)
    wakes = int(path.read_text().split()[2]) - before
    watchdog.stop()
    assert 2 <= wakes <= 8, wakes
    assert watchdog.heartbeat_fields() == {}, "stopped"
