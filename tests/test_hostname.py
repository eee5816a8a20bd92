"""$TUIMON_HOST: the host name a publisher reports, one helper for every place that names it.

A container's machine name is a random id and simulated nodes on one machine share one name, so
users rename the sender; a bad name must stop the start (not make every viewer refuse the run), and
discovery must keep judging registry entries by the machine they were written on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from publisher.monitor import Monitor
from publisher.wire.hostname import host_name, machine_name
from publisher.wire.registry import live_entries, register
from publisher.wire.transport import Publisher


def test_tuimon_host_overrides_the_machine_name_and_empty_means_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TUIMON_HOST", raising=False)
    assert host_name() == machine_name() == socket.gethostname()
    monkeypatch.setenv("TUIMON_HOST", "nodeA")
    assert host_name() == "nodeA"
    assert machine_name() == socket.gethostname()  # the machine itself is not renamed
    monkeypatch.setenv("TUIMON_HOST", "")
    assert host_name() == socket.gethostname()


@pytest.mark.parametrize(
    "value", ["n" * 257, "node A", "node\n", "tab\there"], ids=["long", "space", "newline", "tab"]
)
def test_a_bad_tuimon_host_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TUIMON_HOST", value)
    with pytest.raises(ValueError, match=r"\$TUIMON_HOST must be a name"):
        host_name()
    with pytest.raises(ValueError, match=r"\$TUIMON_HOST"):
        Publisher("refused", register=False)


def test_a_bad_tuimon_host_stops_the_monitor_at_start(
    monkeypatch: pytest.MonkeyPatch, private_runtime_dir: Path
) -> None:
    monkeypatch.setenv("TUIMON_HOST", "x" * 300)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=r"\$TUIMON_HOST must be a name of 1 to 256 characters"):
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), run="refused", gpu="none")
    assert not list(private_runtime_dir.glob("*.json"))  # nothing announced a run that never started


def test_the_publisher_names_its_messages_and_registry_entry_after_tuimon_host(
    monkeypatch: pytest.MonkeyPatch, private_runtime_dir: Path
) -> None:
    monkeypatch.setenv("TUIMON_HOST", "nodeA")
    with Publisher("renamed") as publisher:
        assert publisher.host == "nodeA"
        [path] = private_runtime_dir.glob("renamed.*.json")
        entry = json.loads(path.read_text())
        assert (entry["host"], entry["machine"]) == ("nodeA", socket.gethostname())
        # A viewer without the variable, on the same machine, still finds it.
        monkeypatch.delenv("TUIMON_HOST")
        [found] = live_entries()
        assert (found.run, found.host, found.machine) == ("renamed", "nodeA", socket.gethostname())


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _announce(run: str, host: str, machine: str | None, pid: int) -> Path:
    return register(run=run, rank=0, host=host, machine=machine, pid=pid, pub="tcp://127.0.0.1:1",
                    snapshot="tcp://127.0.0.1:2", record=None, started=time.time())


def test_renamed_entries_are_judged_by_their_machine() -> None:
    here = machine_name()
    alive = _announce("alive", "nodeA", here, os.getpid())
    dead = _announce("dead", "nodeB", here, _dead_pid())
    # Named like this machine, written on another: its pid means nothing here, so it is kept.
    foreign = _announce("foreign", here, "another-machine", _dead_pid())

    assert [entry.run for entry in live_entries()] == ["alive"]
    assert alive.exists() and not dead.exists() and foreign.exists()


def test_entries_written_before_the_machine_field_are_judged_by_their_host(private_runtime_dir: Path) -> None:
    path = _announce("old", machine_name(), None, os.getpid())
    entry = json.loads(path.read_text())
    del entry["machine"]
    path.write_text(json.dumps(entry))

    [found] = live_entries()
    assert (found.run, found.machine) == ("old", machine_name())
