"""The one place a publisher learns its host name: ``$TUIMON_HOST``, else the machine's own name.

The host name goes into every message's envelope, the registry entry and the reproduction record;
taking it here only keeps them in agreement. ``$TUIMON_HOST`` exists because the machine's own name
is not always the useful one: in a container it is a random id, and several simulated nodes on one
machine (one process each) would all share it. The override renames the sender only:
:func:`machine_name` stays the real one, because a registry entry's pid means something only on
the machine that wrote it (:mod:`publisher.wire.registry`).

A bad ``$TUIMON_HOST`` is refused with a ValueError naming it when the publisher starts. If it went
out unchecked, viewers would refuse every message of the run (names are bounded by the protocol,
:data:`~publisher.wire.validation.MAX_NAME_CHARS`).
"""

from __future__ import annotations

import os
import socket

from publisher.wire.validation import MAX_NAME_CHARS

#: Environment variable that overrides the host name a publisher reports.
ENV_HOST = "TUIMON_HOST"


def machine_name() -> str:
    """This machine's own name (``gethostname``), whatever ``$TUIMON_HOST`` says."""
    return socket.gethostname()


def host_name() -> str:
    """The host name to report: ``$TUIMON_HOST`` when it is set and not empty, else :func:`machine_name`.

    Raises ValueError when ``$TUIMON_HOST`` is not a valid name (see :func:`check_host_name`).
    """
    override = os.environ.get(ENV_HOST)
    if not override:
        return machine_name()
    return check_host_name(override, f"${ENV_HOST}")


def check_host_name(value: str, what: str = "host") -> str:
    """``value`` if it is a name every reader accepts, else a ValueError that names ``what``.

    The protocol only bounds a name's length (1 to 256 characters). A host name with spaces or
    control characters is refused as well: it is almost always a quoting mistake, and it would be
    hard to tell apart from a real name on the screen.
    """
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise ValueError(f"{what} must be a name of 1 to {MAX_NAME_CHARS} characters, got {repr(value)[:80]}")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(
            f"{what} must be a name without spaces or control characters, got {repr(value)[:80]}"
        )
    return value
