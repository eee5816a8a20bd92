"""Relays for tests: one served on a thread for the length of a ``with`` block, or a job's tree
of ``tuimon relay`` processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from helpers.cli import TUIMON
from helpers.ports import free_port
from helpers.waiting import wait_until
from publisher.wire.transport import Publisher
from tuimon.relay.forwarder import Relay


@contextlib.contextmanager
def running(relay: Relay) -> Iterator[Relay]:
    """Serve ``relay`` on a thread; stop it and wait for it when the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=relay.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join(timeout=5)


@contextlib.contextmanager
def stepping(publishers: Sequence[Publisher], step: int = 0) -> Iterator[None]:
    """Each of ``publishers`` trains on a thread while the block lasts: a ``metrics`` message a step,
    20 steps a second, from ``step + 1`` on."""
    stop = threading.Event()

    def train() -> None:
        number = step
        while not stop.wait(0.05):
            number += 1
            for publisher in publishers:
                publisher.publish("metrics", step=number, metrics={"loss": 1.0 / number})

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@contextlib.contextmanager
def relay_processes(folder: Path, hosts: Sequence[str]) -> Iterator[str]:
    """A root relay and a node relay for each of ``hosts``, each a ``tuimon relay`` process of its
    own, as a job runs them: the node relay of host H finds its ranks in the run registry
    ``folder / H`` and says ``$TUIMON_HOST`` H. Yields the root's address once every relay said
    where it listens; stops them all when the block ends."""
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    processes: list[subprocess.Popen[bytes]] = []

    def start(arguments: list[str], runtime: Path, host: str) -> None:
        env = {**os.environ, "TUIMON_RUNTIME_DIR": str(runtime), "TUIMON_HOST": host}
        env.pop("TUIMON_RELAY", None)
        log = folder / f"relay-{host}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([*TUIMON, "relay", *arguments], stderr=out, env=env)
        processes.append(process)
        wait_until(
            lambda: "viewers connect to" in log.read_text(errors="replace") or process.poll() is not None,
            timeout_s=30,
            what=f"the relay of {host} listening",
        )
        assert process.poll() is None, log.read_text(errors="replace")

    try:
        start(["--root", "--listen", root_address], folder / "root", "login1")
        for host in hosts:
            start(["--upstream", root_address], folder / host, host)
        yield root_address
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
