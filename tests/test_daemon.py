"""tuimon's threads in a training process leave torch's intra-op thread pool alone.

PyTorch's OpenMP runtime keeps a pool of threads for each thread that runs a parallel operation;
a second pool makes the threads outnumber the CPUs and every parallel region of the training
thread then waits for sleeping threads to wake (``publisher/threads/daemon.py``). Judged here at
two torch threads, the count users run on this machine, as the training thread's off-CPU time and
as the threads in the process, never at ``OMP_NUM_THREADS=1``, where there is no pool to add.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
import torch
from helpers.cli import SCRIPTS, TUIMON

from publisher.threads.daemon import daemon_thread


def _native_threads() -> set[int]:
    """The process's threads that are not Python threads (torch's pool threads among them)."""
    python = {thread.native_id for thread in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


def test_a_parallel_torch_op_on_a_daemon_thread_adds_no_pool_and_leaves_the_callers_count() -> None:
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _measure_on_a_daemon_thread()
    finally:
        torch.set_num_threads(kept)


def _measure_on_a_daemon_thread() -> None:
    big = torch.randn(1 << 20)
    big.sum()  # this thread's pool exists before the count is taken
    before = _native_threads()
    seen: dict[str, object] = {}
    done = threading.Event()

    def measure() -> None:
        seen["sum"] = float(big.sum())
        seen["threads"] = _native_threads() - before
        seen["torch_threads"] = torch.get_num_threads()
        done.wait()  # alive while the count below is taken: a pool dies with its thread

    thread = daemon_thread(measure, "measuring")
    thread.start()
    while "threads" not in seen:
        thread.join(0.01)
    done.set()
    thread.join()
    assert seen["sum"] == pytest.approx(float(big.sum()), rel=1e-4)
    assert seen["threads"] == set(), "a pool was made for the daemon thread"
    assert seen["torch_threads"] == 1
    assert torch.get_num_threads() == 2  # the caller's own count (and the process default) kept


def _trained(command: list[str]) -> tuple[float, int]:
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"off_cpu=([\d.]+) native_threads=(\d+)", done.stdout)
    assert found, done.stdout + done.stderr[-2000:]
    return float(found[1]), int(found[2])


@pytest.mark.solo
def test_tuimon_run_costs_a_two_thread_training_no_off_cpu_time_and_no_second_pool() -> None:
    """An unmodified script whose loss reads 49,920 logits, the size torch runs in parallel: under
    `tuimon run` its training thread stays on its CPU as without it (it was off it ~30 % of the
    time, 1.3-1.9x slower, when the loss's look ran on the step worker with a pool of its own)."""
    script = [sys.executable, str(SCRIPTS / "plain_threaded_lm.py"), "--threads", "2", "--steps", "40"]
    plain_off, plain_threads = _trained(script)
    watched_off, watched_threads = _trained([*TUIMON, "run", "--gpu", "none", "--", *script])
    assert watched_threads == plain_threads, "a thread of tuimon's made torch a second pool"
    assert watched_off <= plain_off + 0.10, f"off CPU {watched_off:.0%} watched against {plain_off:.0%} plain"
