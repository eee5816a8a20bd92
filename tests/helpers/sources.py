"""Sources the test fills itself, behind the interface the app uses."""

from __future__ import annotations

from tuimon.store import Store


class FedSource:
    """A source whose store the test fills itself (with real decoded messages): the app starts,
    stops and names it, and the test decides what arrives when. ``focused`` records the ranks the
    app asked to receive in full, as a live source behind a relay is asked."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.focused: list[tuple[str, int]] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def where(self) -> str:
        return "tcp://login1:7000 (root relay)"

    def focus_rank(self, run: str, rank: int) -> None:
        self.focused.append((run, rank))
