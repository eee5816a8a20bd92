"""CURVE beyond loopback, on real sockets bound to this machine's own non-loopback address: the job's
key lets peers in, a peer without it is refused, and both sides say so."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers.ports import free_port
from helpers.relays import running

from publisher.wire.curve import load_keys, make_keys
from publisher.wire.transport import Publisher
from tuimon.relay.forwarder import Relay
from tuimon.sources.live import LiveSource


def own_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None: the machine has none)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


ADDRESS = own_address()
pytestmark = pytest.mark.skipif(ADDRESS is None, reason="no non-loopback IPv4 address on this machine")


@pytest.fixture
def keys_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no keys found by default
    return make_keys(tmp_path / "keys" / "job.key_secret")


def keep_publishing(publisher: Publisher, until: threading.Event) -> threading.Thread:
    def loop() -> None:
        step = 0
        while not until.is_set():
            step += 1
            publisher.publish("metrics", step=step, metrics={"loss": 1.0})
            time.sleep(0.02)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_the_keys_command_writes_a_private_secret_and_refuses_to_overwrite_it(tmp_path: Path) -> None:
    target = tmp_path / "k" / "job.key_secret"
    tuimon = [sys.executable, "-m", "tuimon.cli", "keys", str(target)]
    done = subprocess.run(tuimon, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == str(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and (tmp_path / "k" / "job.key").exists()
    again = subprocess.run(tuimon, capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "already exists" in again.stderr
    target.chmod(0o644)
    with pytest.raises(ValueError, match="readable by other users"):
        load_keys(target)


def test_a_publisher_beyond_loopback_lets_in_the_job_key_only_and_both_sides_say_so(
    keys_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = load_keys(keys_file)
    publisher = Publisher("secret-run", endpoint=f"tcp://{ADDRESS}:*", keys=keys, heartbeat_s=0.2)
    stop = threading.Event()
    keep_publishing(publisher, stop)
    with_key = LiveSource([publisher.endpoint], keys=keys)
    without = LiveSource([publisher.endpoint])
    try:
        with_key.start()
        without.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
            with_key.store.series("secret-run", "loss")[0]
            and any("requires CURVE" in notice for notice in without.store.notices())
        ):
            time.sleep(0.1)
        assert with_key.store.series("secret-run", "loss")[0], "the job's key gets the run"
        assert without.store.run_names() == [], "no key: nothing is read"
        assert any("requires CURVE" in notice for notice in without.store.notices()), without.store.notices()
        time.sleep(1.0)  # the next heartbeat counts the refusals
        assert publisher.stats()["refused"] > 0
    finally:
        stop.set()
        with_key.stop()
        without.stop()
        publisher.close()


def test_relays_across_machines_use_the_job_key_and_refuse_a_node_without_it(
    keys_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = load_keys(keys_file)
    root_address = f"tcp://{ADDRESS}:{free_port(span=2)}"
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path / "node"))
    publisher = Publisher("job", 0, heartbeat_s=0.2)  # on loopback, as on any node
    root = Relay(listen=root_address, root=True, keys=keys, heartbeat_s=0.2)
    node = Relay(
        listen="tcp://127.0.0.1:*",
        upstream=root_address,
        registry_dir=tmp_path / "node",
        keys=keys,
        heartbeat_s=0.2,
    )
    stranger = Relay(
        listen="tcp://127.0.0.1:*",
        upstream=root_address,
        registry_dir=tmp_path / "node",
        host="stranger",
        heartbeat_s=0.2,
    )
    stop = threading.Event()
    keep_publishing(publisher, stop)
    viewer = LiveSource([root_address], keys=keys)
    try:
        with running(root), running(node), running(stranger):
            viewer.start()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (viewer.store.job_view("job") and root.refused):
                time.sleep(0.1)
            assert viewer.store.job_view("job") is not None, "the keyed node's summaries reach the root"
            relays = {beat["run"] for beat in viewer.store.relays()}
            assert node.name in relays and "node@stranger" not in relays, "the keyless relay is refused"
            assert root.refused > 0
    finally:
        stop.set()
        viewer.stop()
        publisher.close()
