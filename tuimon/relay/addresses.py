"""The one address a user types for a root relay, and the second one derived from it.

A root relay needs two sockets: the XPUB viewers subscribe to, and the XSUB node relays forward
into. The user types one address everywhere (``tuimon relay --root --listen ADDR``, ``tuimon relay
--upstream ADDR``, ``tuimon watch ADDR``); the relays' port is derived from it: the next port for
``tcp://HOST:PORT``, ``PATH.in`` beside an ``ipc://PATH`` socket.
"""

from __future__ import annotations

from tuimon.errors import UserError


def ingest_address(listen: str) -> str:
    """Where node relays send to, for a root whose viewers connect to ``listen``."""
    if listen.startswith("ipc://"):
        return listen + ".in"
    head, _, port = listen.rpartition(":")
    if not listen.startswith("tcp://") or not port.isdigit():
        raise UserError(f"a root relay needs a fixed address, tcp://HOST:PORT or ipc://PATH; got {listen!r}")
    if int(port) + 1 > 65535:
        raise UserError(f"a root relay uses PORT and PORT+1: {listen!r} leaves no room for the second")
    return f"{head}:{int(port) + 1}"
