"""The fault and healthy scripts of tests/faults/, run as real subprocesses sharing this machine's
cores: what test_faults.py (the model given) and test_invariants.py (without it) read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

FAULTS = Path(__file__).resolve().parents[1] / "faults"
sys.path.insert(0, str(FAULTS))

import _harness as h  # noqa: E402  (the scripts import it by this name too)


def harness_env(tmp: Path) -> dict[str, str]:
    """The environment of a script under test: its own runtime folder, output as it comes."""
    return {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp / "runtime"), "PYTHONUNBUFFERED": "1"}


def run_batches(out: Path, names: list[str], *options: str, timeout: float) -> Path:
    """Run the scripts ``names`` in harness processes, recording into ``out`` (read them with
    ``_harness.recordings_of``).

    Two processes share the one-process scripts (each takes the next one not yet taken), one
    torch thread each, one core each (as in ``make shared-tests``); the 2-process (gloo) scripts
    follow in their own pair, so that at no time do more CPU-bound processes run than this machine
    has cores. A script's verdict is read from its recording in steps, and the paced ones' steps
    keep their own length, so sharing changes no figure the tests judge; it halves the suite's
    wall time on two cores."""
    single = [name for name in names if h._load(name).world_size == 1]
    distributed = [name for name in names if h._load(name).world_size > 1]
    deadline = time.monotonic() + timeout
    if single:
        _wait_all([_start(out, single, ("--shared", *options)) for _ in range(2)], deadline)
    if distributed:
        _wait_all([_start(out, distributed, options)], deadline)
    return out


def _start(out: Path, names: list[str], options: tuple[str, ...]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(FAULTS / "_harness.py"), "--record-dir", str(out), *options, *names],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**harness_env(out), "OMP_NUM_THREADS": "1"}, cwd=FAULTS,
    )


def _wait_all(batches: list[subprocess.Popen[str]], deadline: float) -> None:
    for batch in batches:
        try:
            _, stderr = batch.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in batches:
                other.kill()
            raise
        assert batch.returncode == 0, stderr[-3000:]
