"""TCP ports for tests that must name one before a program binds it, and addresses where nobody
listens, without a race between the test processes.

Binding port 0 and closing the socket is not enough: the kernel hands that port out again to the
next ``bind(0)`` or outgoing connection of any process (the other test process, the subprocesses
both start, ZeroMQ's ``tcp://127.0.0.1:*``), and a client that keeps reconnecting to a closed port
of the ephemeral range can even be connected to itself (TCP simultaneous open). Ports below the
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) are never handed out by the kernel, so
each test process takes them from its own slice of that range and never hands one out twice.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path

#: The slices start here (below Linux's default ephemeral range, 32768-60999).
FIRST_PORT = 20_000
SLICE = 2_000
_handed_out = itertools.count()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _slice_start() -> int:
    """This process's slice: one per pytest-xdist worker (``gw0``, ``gw1``...); a run without xdist
    takes the first (the solo phase runs after the parallel one, never beside it)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    slices = max(1, (_ephemeral_start() - FIRST_PORT) // SLICE)
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return FIRST_PORT + (index % slices) * SLICE


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A port P such that P .. P+span-1 are free on 127.0.0.1 now and handed to no other test of
    this run (a root relay binds two consecutive ports: ``span=2``)."""
    start = _slice_start()
    for _ in range(SLICE):
        offset = next(_handed_out) % (SLICE - span + 1)
        port = start + offset
        if all(_free(candidate) for candidate in range(port, port + span)):
            for _ in range(span - 1):
                next(_handed_out)
            return port
    raise RuntimeError(f"no {span} free consecutive ports in {start}..{start + SLICE - 1}")


@contextlib.contextmanager
def nobody_listening() -> Iterator[str]:
    """A tcp address on 127.0.0.1 that refuses every connection while the block runs: its port is
    bound by a socket that never listens, so no other program can take it and no outgoing
    connection can be given it as its own port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{holder.getsockname()[1]}"
