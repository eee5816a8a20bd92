"""Fixtures and collection rules of the suite; what the tests build and drive is in :mod:`helpers`.

Everything is real: messages are built with ``publisher.wire.protocol``, recordings are files,
peers are ZeroMQ sockets on 127.0.0.1, and every test gets its own run registry and knowledge base.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from helpers.peers import RawPublisher
from helpers.recordings import write_recording
from helpers.runs import synthetic_run

# pytest-xdist's workers set COLUMNS=80 and LINES=24, which every program the tests start would
# take over the size of its pty (Textual, argparse's help): the tests' processes see what a
# user's shell gives them instead.
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)

#: Modules that measure time on this machine (detection delays against their budgets, healthy runs
#: that must not look slow, waits for a CPU): marked ``solo``, which ``make test`` runs alone after
#: the rest has run in two processes, so that another test's work is not what they measure. A test
#: of another module that times the machine carries the mark itself.
SOLO_MODULES = frozenset({"test_faults", "test_invariants", "test_invariants_ddp", "test_cpu_wait",
                          "test_stalls"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SOLO_MODULES:
            item.add_marker(pytest.mark.solo)


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    """A recording of :func:`synthetic_run` (30 s of recorded time)."""
    return write_recording(tmp_path / "synthetic.jsonl", synthetic_run())


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def raw_publisher(context: zmq.Context) -> Iterator[RawPublisher]:
    publisher = RawPublisher(context)
    yield publisher
    publisher.close()


# ------------------------------------------------------------------------------ knowledge base


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own run registry through $TUIMON_RUNTIME_DIR: publishers a test starts
    never show up in the developer's `tuimon watch`, nor in another test's."""
    directory = tmp_path / "runtime"
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(directory))
    return directory


@pytest.fixture(autouse=True)
def private_kb_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's dashboard (and `tuimon` subprocess) gets its own knowledge base folder through
    $TUIMON_KB, never the developer's ~/.local/share/tuimon/kb: the dashboard opens its knowledge
    base when it starts. Tests that need a specific folder pass --kb / kb_dir, which wins."""
    folder = tmp_path / "default-kb"
    monkeypatch.setenv("TUIMON_KB", str(folder))
    return folder
