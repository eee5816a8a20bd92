"""Discovery of the live runs on this node: one small JSON file per publisher in a runtime folder.

``tuimon watch`` with no argument must find every run the user started here without being told a
port. Each :class:`~publisher.wire.transport.Publisher` writes ``<run>.<rank>.<pid>.json`` into the
runtime folder once its sockets are bound and removes it on exit; a process that died without
cleaning up is recognised by its pid (and its start time, so that a recycled pid does not
resurrect a dead run) and its file is removed by the next reader.

The folder is private to the user (mode 0700): the files name sockets that carry the user's
training data. Symbolic links and folders owned by someone else are refused, so that another user
cannot pre-create ``/tmp/tuimon-<uid>`` and steer viewers to their own endpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from publisher.wire.hostname import machine_name
from publisher.wire.protocol import PROTOCOL_VERSION

#: A registry file is a few hundred bytes; anything much larger is not ours and is not read.
_MAX_ENTRY_BYTES = 64 * 1024
#: A process created this long after the entry's ``started`` time cannot be the process that wrote
#: it: its pid was recycled. The slack covers clock granularity of process start times.
_PID_REUSE_SLACK_S = 1.0
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_MAX_NAME_CHARS = 100


@dataclass(frozen=True)
class RegistryEntry:
    """One live publisher: where to subscribe (``pub``), where to ask for a snapshot, and who it is.

    ``host`` is the name the publisher reports (``$TUIMON_HOST`` may have chosen it); ``machine``
    is the machine its ``pid`` lives on, the same as ``host`` unless it was overridden.
    """

    run: str
    rank: int
    host: str
    pid: int
    pub: str
    snapshot: str
    record: str | None
    started: float
    path: Path
    machine: str


def runtime_dir() -> Path:
    """The runtime folder, created private (0700) if missing and checked if it already exists.

    ``$TUIMON_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/tuimon``, else ``/tmp/tuimon-<uid>``. The
    last is ``/tmp`` on purpose, not ``$TMPDIR``: batch schedulers give each job its own
    ``$TMPDIR``, and a viewer in another shell must find the same folder as the training job.

    Raises :class:`PermissionError` (naming the folder and what to do) when the folder is a
    symbolic link or belongs to another user.
    """
    if explicit := os.environ.get("TUIMON_RUNTIME_DIR"):
        directory = Path(explicit)
    elif xdg := os.environ.get("XDG_RUNTIME_DIR"):
        directory = Path(xdg) / "tuimon"
    else:
        directory = Path("/tmp") / f"tuimon-{os.getuid()}"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    info = os.lstat(directory)
    advice = "set TUIMON_RUNTIME_DIR to a folder of your own"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"tuimon runtime folder {directory} is not a plain folder (a link?); {advice}")
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"tuimon runtime folder {directory} belongs to uid {info.st_uid}, not you; {advice}"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return directory


def _file_name(run: str, rank: int, pid: int) -> str:
    """``<run>.<rank>.<pid>.json`` with the run name reduced to characters safe in a file name."""
    safe_run = _UNSAFE_NAME_CHARS.sub("_", run).lstrip(".")[:_MAX_NAME_CHARS] or "run"
    return f"{safe_run}.{rank}.{pid}.json"


def register(
    *,
    run: str,
    rank: int,
    host: str,
    pid: int,
    pub: str,
    snapshot: str,
    record: str | None,
    started: float,
    machine: str | None = None,
) -> Path:
    """Announce a live publisher; returns the file to pass to :func:`unregister`.

    ``machine`` is the machine ``pid`` runs on, when ``host`` is a name of the user's choosing
    (``$TUIMON_HOST``); readers judge whether the entry is alive by it. It defaults to ``host``.
    Written to a temporary file and renamed into place, so a reader never sees half an entry.
    """
    directory = runtime_dir()
    entry = {
        "v": PROTOCOL_VERSION,
        "run": run,
        "rank": rank,
        "host": host,
        "machine": host if machine is None else machine,
        "pid": pid,
        "pub": pub,
        "snapshot": snapshot,
        "record": record,
        "started": started,
    }
    path = directory / _file_name(run, rank, pid)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            json.dump(entry, tmp)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return path


def unregister(path: Path) -> None:
    """Remove an entry; already gone (a viewer cleaned it, or a second close) is fine."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _parse_entry(path: Path) -> RegistryEntry | None:
    """The entry in ``path``, or None if it is unreadable, oversized or not a registry entry."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(_MAX_ENTRY_BYTES + 1)
        data: Any = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if len(raw) > _MAX_ENTRY_BYTES or not isinstance(data, dict) or data.get("v") != PROTOCOL_VERSION:
        return None
    record = data.get("record")
    started = data.get("started")
    machine = data.get("machine", data.get("host"))  # entries written before "machine" existed
    if not (
        all(isinstance(data.get(name), str) for name in ("run", "host", "pub", "snapshot"))
        and all(type(data.get(name)) is int for name in ("rank", "pid"))
        and (record is None or isinstance(record, str))
        and isinstance(machine, str)
        and isinstance(started, int | float)
        and not isinstance(started, bool)
    ):
        return None
    return RegistryEntry(
        run=data["run"],
        rank=data["rank"],
        host=data["host"],
        pid=data["pid"],
        pub=data["pub"],
        snapshot=data["snapshot"],
        record=record,
        started=float(started),
        path=path,
        machine=machine,
    )


def _is_alive(pid: int, started: float) -> bool:
    """Whether ``pid`` is still the process that registered at ``started`` (zombies are dead)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= started + _PID_REUSE_SLACK_S
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def live_entries(directory: Path | None = None) -> list[RegistryEntry]:
    """Publishers alive on this host, oldest first (then by rank); stale entries are removed.

    Entries from another machine (a runtime folder on a shared file system) are skipped but kept:
    their pid means nothing here. The machine is the entry's ``machine``, not its ``host``, so a
    run renamed with ``$TUIMON_HOST`` on this machine is still found here. Files that are not
    valid entries are skipped and left alone.
    """
    directory = runtime_dir() if directory is None else directory
    this_machine = machine_name()
    entries = []
    for path in directory.glob("*.json"):
        entry = _parse_entry(path)
        if entry is None or entry.machine != this_machine:
            continue
        if _is_alive(entry.pid, entry.started):
            entries.append(entry)
        else:
            unregister(path)
    entries.sort(key=lambda entry: (entry.started, entry.rank))
    return entries
