"""Waiting for something a test expects, with a deadline that names what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    condition: Callable[[], object],
    timeout_s: float = 5.0,
    what: str = "condition",
    tick: Callable[[], None] | None = None,
) -> None:
    """Poll ``condition`` (calling ``tick`` between polls, e.g. to keep a peer publishing)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        if tick is not None:
            tick()
        time.sleep(0.01)


async def wait_for_screen(
    pilot: Any, condition: Callable[[], object], timeout_s: float = 10.0, what: str = "screen condition"
) -> None:
    """Let the app run until ``condition`` holds (read widgets in it, as a user reads the screen)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await pilot.pause(0.05)
