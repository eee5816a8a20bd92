"""A node relay forwards only valid frames: junk from a publisher is counted in the relay's
heartbeat and dropped, never reaches a viewer at the node or at the root, and the valid messages
around it still do. Real sockets: a raw ZeroMQ PUB as the publisher, two real relays, two SUBs."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.ports import free_port
from helpers.relays import running
from helpers.waiting import wait_until

from publisher.wire.protocol import ProtocolError, decode, encode, make_message
from publisher.wire.topics import subscription
from tuimon.relay.forwarder import Relay

HOST = "nodeV"


class RawViewer:
    """A SUB on a relay subscribed to everything, keeping each frame as it came (a decoding viewer
    would hide junk that reached it)."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        self.sub = context.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.subscribe(b"")
        self.sub.connect(address)
        self.frames: list[bytes] = []

    def read(self) -> None:
        while self.sub.poll(0):
            self.frames.append(self.sub.recv())

    def decoded(self) -> list[dict[str, Any]]:
        return [message for message in map(_decoded, self.frames) if message is not None]

    def malformed(self) -> list[bytes]:
        return [frame for frame in self.frames if _decoded(frame) is None]

    def steps(self, run: str) -> set[int]:
        return {m["step"] for m in self.decoded() if m["run"] == run and m["type"] == "metrics"}

    def beats(self, relay: str) -> list[dict[str, Any]]:
        return [m for m in self.decoded() if m["type"] == "relay" and m["run"] == relay]


def _decoded(frame: bytes) -> dict[str, Any] | None:
    try:
        return decode(frame)
    except ProtocolError:
        return None


def junk() -> list[bytes]:
    """One frame of each kind of malformed input, each refused by ``decode``."""
    wrong_type = encode(
        make_message("metrics", run="junk", rank=0, host=HOST, ts=1.0, seq=0, step="three", metrics={})
    )
    frames = [
        random.Random(9).randbytes(64),  # noise
        b"",  # an empty frame
        b"[1, 2, 3]",  # JSON, not an object
        subscription("metrics") + b'"run":"junk",\xff\x00 garbage {',  # our envelope, then garbage
        wrong_type,  # valid JSON, our envelope, a string where the step is a number
    ]
    for frame in frames:
        with pytest.raises(ProtocolError):
            decode(frame)
    return frames


def test_a_node_relay_drops_malformed_frames_counts_them_and_forwards_the_rest(context: zmq.Context) -> None:
    publisher = context.socket(zmq.PUB)
    publisher.linger = 0
    publisher.bind("tcp://127.0.0.1:*")
    source = publisher.getsockopt_string(zmq.LAST_ENDPOINT)
    root_address = f"tcp://127.0.0.1:{free_port(span=2)}"
    root = Relay(listen=root_address, root=True, heartbeat_s=0.2)
    node = Relay(
        listen="tcp://127.0.0.1:*", sources=[source], upstream=root_address, host=HOST, heartbeat_s=0.2
    )
    seq = 0

    def valid(run: str, step: int) -> bytes:
        nonlocal seq
        seq += 1
        return encode(
            make_message("metrics", run=run, rank=0, host=HOST, ts=time.time(), seq=seq, step=step,
                         metrics={"loss": 1.0 / step})
        )

    with running(root), running(node):
        at_node, at_root = RawViewer(context, node.listen), RawViewer(context, root_address)
        viewers = (at_node, at_root)
        warm = 0

        def warm_up() -> None:  # until both viewers' subscriptions reach the publisher through the tree
            nonlocal warm
            warm += 1
            publisher.send(valid("warm-up", warm))
            for viewer in viewers:
                viewer.read()
            time.sleep(0.02)

        wait_until(
            lambda: all(viewer.steps("warm-up") for viewer in viewers),
            timeout_s=15,
            what="a valid message at the node and at the root",
            tick=warm_up,
        )
        bad = junk()
        rounds = 3
        step = 0
        for _ in range(rounds):  # valid messages with every kind of junk between them
            for frame in bad:
                step += 1
                publisher.send(valid("valid", step))
                publisher.send(frame)
        before_junk_ended = step
        for _ in range(20):  # and after it: the relay goes on forwarding
            step += 1
            publisher.send(valid("valid", step))
            time.sleep(0.005)
        sent = set(range(1, step + 1))

        def read() -> None:
            for viewer in viewers:
                viewer.read()
            time.sleep(0.02)

        for viewer, where in ((at_node, "the node"), (at_root, "the root")):
            wait_until(
                lambda viewer=viewer: viewer.steps("valid") == sent,
                timeout_s=10,
                what=f"every valid message at {where}",
                tick=read,
            )

        def counted() -> dict[str, int] | None:
            beats = at_root.beats(node.name)
            stats = beats[-1]["stats"] if beats else None
            return stats if stats and stats["in"] >= 2 * rounds * len(bad) + 20 else None

        wait_until(lambda: counted() is not None, timeout_s=10, what="a node beat counting it all", tick=read)
        stats = counted()
        assert stats is not None
        assert stats["malformed"] == rounds * len(bad), "each malformed frame counted once"
        assert stats["out"] > 0
        for viewer in viewers:
            assert viewer.malformed() == [], "no malformed frame reached a viewer"
            assert before_junk_ended < max(viewer.steps("valid")), "forwarding went on after the junk"
        root_beats = at_root.beats(root.name)
        assert root_beats and root_beats[-1]["stats"]["malformed"] == 0, "nothing malformed reached the root"
    # By reason, as `decode` names them (noise, the empty frame and the envelope with garbage are
    # not JSON).
    by_reason = {"not JSON": 3 * rounds, "not an object": rounds, "invalid field": rounds}
    assert node.analysis.malformed == by_reason
    publisher.close()


def test_a_root_relay_takes_no_run_registry(tmp_path: Path) -> None:
    """A root's inputs are node relays, which validate; it has no intake of its own for publishers."""
    with pytest.raises(ValueError, match="does not scan a run registry"):
        Relay(listen=f"tcp://127.0.0.1:{free_port(span=2)}", root=True, registry_dir=tmp_path)
