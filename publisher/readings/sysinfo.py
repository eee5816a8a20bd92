"""What a run needs to be understood and reproduced later: versions, the reproduction record, RSS.

Everything here is read once and cached, except :func:`host_rss_bytes` (a ``pread``, which the
Monitor samples at a bounded rate). Nothing here may fail a training run: a missing git, a
missing torch or an odd platform give ``None`` fields, never exceptions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

import psutil

from publisher.wire.hostname import host_name, machine_name
from publisher.wire.jsonsafe import json_safe

#: A git that hangs (network filesystem, huge repo) must not delay the start of training.
GIT_TIMEOUT_S = 2.0


@functools.cache
def versions() -> dict[str, str | None]:
    """Versions of what decides a run's numbers: python, torch, CUDA, cuDNN, tuimon, platform."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": None,
        "cuda": None,
        "cudnn": None,
        "tuimon": _package_version("tuimon"),
        "platform": platform.platform(),
    }
    try:
        import torch
    except ImportError:
        return found
    found["torch"] = torch.__version__
    found["cuda"] = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    found["cudnn"] = str(cudnn) if cudnn is not None else None
    return found


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def host_rss_bytes() -> int:
    """Resident set size of this process in bytes: one ``pread`` of ``/proc/self/statm`` kept open
    (~1 us, cheap enough for every few steps), psutil elsewhere (~10 us)."""
    pid = os.getpid()
    if _statm[0] != pid:  # first call, or a forked child: /proc/self was resolved by the parent
        try:
            _statm[:] = [pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)]
        except OSError:
            _statm[:] = [pid, None]
    fd = _statm[1]
    if fd is not None:
        try:
            return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            _statm[1] = None
    return _this_process().memory_info().rss


#: ``[pid, fd]`` of the open ``/proc/self/statm`` (fd None: not available), and the page size.
_statm: list[Any] = [None, None]
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
def _this_process() -> psutil.Process:
    return psutil.Process()


@functools.cache
def git_state(cwd: str) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git work tree holding ``cwd``, or None when there is none.

    Runs git with a short timeout; any failure (no git, not a repository, timeout) gives None.
    """
    commit = _git(cwd, "rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _git(cwd: str, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def config_hash(config: Any) -> str | None:
    """A stable short hash of a config: same content, same hash, whatever the key order.

    Two runs with the same hash were given the same hyper-parameters, which is the first thing
    to check when two "identical" runs differ.
    """
    if config is None:
        return None
    canonical = json.dumps(json_safe(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def determinism_flags() -> dict[str, bool | None]:
    """PyTorch's determinism switches (read each time: training code may change them late)."""
    try:
        import torch
    except ImportError:
        return {"deterministic_algorithms": None, "cudnn_benchmark": None, "cudnn_deterministic": None}
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
    }


def torch_seed() -> int | None:
    """The seed torch's default generator started from (set by ``torch.manual_seed`` or random)."""
    try:
        import torch
    except ImportError:
        return None
    return int(torch.initial_seed())


def _reported_host() -> str:
    """The host the envelope names (``$TUIMON_HOST`` or the machine's). A bad ``$TUIMON_HOST``
    stops the Publisher before this runs; here it must not fail a run, so the machine's name."""
    try:
        return host_name()
    except ValueError:
        return machine_name()


def reproduction_record(config: Any = None, seed: int | None = None) -> dict[str, Any]:
    """Everything needed to re-run this process: command, place, code version, seeds, switches.

    ``seed`` is the one the user states; ``torch_seed`` is what torch actually started from
    (they differ when the user seeded something else, which is worth seeing).
    """
    cwd = os.getcwd()
    return {
        "seed": seed,
        "torch_seed": torch_seed(),
        "argv": list(sys.argv),
        "executable": sys.executable,
        "cwd": cwd,
        "pid": os.getpid(),
        "hostname": _reported_host(),
        "git": git_state(cwd),
        "config_hash": config_hash(config),
        "determinism": determinism_flags(),
    }
