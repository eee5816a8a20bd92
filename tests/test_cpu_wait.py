"""The training thread's wait for a CPU, read from Linux's scheduler statistics, under real contention."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from publisher.readings.cpu_wait import TASKS, CpuWait

pytestmark = pytest.mark.skipif(not os.path.isdir(TASKS) or not hasattr(os, "sched_setaffinity"),
                                reason="needs Linux scheduler statistics")

#: A process that keeps one core busy for up to 30 s (killed sooner).
BURN = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.time() + 30
while time.time() < end:
    pass
"""


def busy_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def waited_share(others: int) -> float:
    """The share this thread waited while it and ``others`` busy processes share one core, read by
    another thread (as the Monitor's step worker reads the training thread's)."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    burners = [subprocess.Popen([sys.executable, "-c", BURN, str(core)]) for _ in range(others)]
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.3)  # the burners are up
        me = threading.get_native_id()
        wait = CpuWait(lambda: me)
        with ThreadPoolExecutor(1) as reader:
            reader.submit(wait.read, time.perf_counter()).result()
            busy_for(1.0)
            return reader.submit(wait.read, time.perf_counter()).result()["cpu_wait"]
    finally:
        os.sched_setaffinity(0, before)
        for burner in burners:
            burner.kill()
            burner.wait()


def test_a_thread_alone_on_its_core_hardly_waits_and_one_sharing_it_waits_about_half() -> None:
    assert waited_share(0) < 0.2
    assert 0.3 < waited_share(1) < 0.8, "two busy threads on one core: each waits about half the time"


def test_where_the_statistics_are_missing_there_is_no_metric() -> None:
    wait = CpuWait(tasks="/nonexistent/task")
    assert wait.read(1.0) == {} and wait.read(2.0) == {}


def test_a_thread_that_ended_gives_no_reading_and_its_successor_starts_afresh() -> None:
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    me = threading.get_native_id()
    watched = [ended.native_id]
    wait = CpuWait(lambda: watched[0])
    assert wait.read(1.0) == {}
    watched[0] = me
    assert wait.read(2.0) == {}, "the first reading of a thread is its baseline"
    assert 0.0 <= wait.read(3.0)["cpu_wait"] <= 1.0


def _open_schedstat_files() -> set[str]:
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return {name for name in names if name.endswith("/schedstat")}


def test_a_thread_that_ends_while_its_statistics_are_open_is_not_read_again_and_close_closes_them() -> None:
    """The statistics file stays open between readings (a ``pread`` each): a thread that ends then
    gives no reading once it is seen not to run (at most its last stretch before), and does not
    switch the readings off for the thread that follows."""
    already_open = _open_schedstat_files()
    release = threading.Event()
    trainer = threading.Thread(target=release.wait)
    trainer.start()
    watched = [trainer.native_id]
    wait = CpuWait(lambda: watched[0])
    assert wait.read(1.0) == {}
    assert 0.0 <= wait.read(2.0)["cpu_wait"] <= 1.0
    kept = {f"/proc/{os.getpid()}/task/{trainer.native_id}/schedstat"}
    assert _open_schedstat_files() - already_open == kept, "kept open between readings"
    release.set()
    trainer.join()
    # join() returns when the thread has cleared its id; the kernel lets the task go a moment
    # later (until then its statistics are still there, read as a thread that did not run).
    gone = Path(f"/proc/{os.getpid()}/task/{watched[0]}")
    deadline = time.monotonic() + 2.0
    while gone.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # The thread ran until it ended (woken, then returning): a file kept open may give that last
    # stretch once, read frozen; the thread has not run since, so it is looked up again, and gone.
    last_stretch = wait.read(3.0)
    assert last_stretch == {} or 0.0 <= last_stretch["cpu_wait"] <= 1.0
    assert wait.read(4.0) == {}, "an ended thread gives no reading"
    watched[0] = threading.get_native_id()
    assert wait.read(5.0) == {}
    assert 0.0 <= wait.read(6.0)["cpu_wait"] <= 1.0, "its successor is read"
    wait.close()
    assert _open_schedstat_files() <= already_open
