"""JSON Lines recording of a run: the exact wire frames, one a line, on disk within half a second.

A recording is how a run is replayed, shared and examined after a crash, so it must survive the
crash: frames are handed to the operating system at least every :data:`FLUSH_INTERVAL_S`, and a
killed process loses at most the frames of the last interval (plus the publisher's loop latency),
well under a second. Buffering happens here rather than in a buffered file object so that only
whole lines ever reach the file: a reader following the file, or a replay after a crash, never
sees half a message.

The file is opened for appending: an existing recording is never destroyed, and several processes
may record into one file because each flush is a single ``O_APPEND`` write of whole lines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from publisher.wire.protocol import ProtocolError, decode

#: Frames reach the operating system at least this often.
FLUSH_INTERVAL_S = 0.5
#: A burst is flushed early once this much is pending, which bounds the memory used.
MAX_PENDING_BYTES = 1 << 20


class Recorder:
    """Append-only JSON Lines writer; used by one thread (the publisher's sender thread)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered: this class does the buffering, so each flush is exactly one write.
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        except OSError as exc:
            # Name the recording, and the folder too when that is what failed (a file in the way).
            culprit = f" ({exc.filename})" if exc.filename and Path(exc.filename) != self.path else ""
            raise type(exc)(exc.errno, f"cannot record to {self.path}: {exc.strerror}{culprit}") from exc
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._last_flush = time.monotonic()

    def append(self, frame: bytes) -> None:
        """Queue one frame as a line; flushes when the interval has passed or much is pending."""
        self._pending.append(frame)
        self._pending.append(b"\n")
        self._pending_bytes += len(frame) + 1
        if self._pending_bytes >= MAX_PENDING_BYTES:
            self.flush()
        else:
            self.flush_if_due()

    def flush_if_due(self) -> None:
        """Flush if the last flush is older than :data:`FLUSH_INTERVAL_S` (called when idle too)."""
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        """Hand every pending line to the operating system in one write.

        Raises OSError (disk full, file system gone); the pending lines are discarded first, so a
        failing disk cannot make memory grow without bound.
        """
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        data = memoryview(b"".join(self._pending))
        self._pending.clear()
        self._pending_bytes = 0
        while data:
            written = self._file.write(data)
            data = data[written:]

    def close(self) -> None:
        """Flush what is pending and close the file; a second call does nothing."""
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            self._file.close()


def read_recording(
    path: str | os.PathLike[str],
) -> Iterator[tuple[int, bytes, dict[str, Any] | ProtocolError]]:
    """Every non-blank line of a recording: its number (from 1), its bytes, and the decoded
    message or the :class:`ProtocolError` that refused it, so each reader decides what a bad
    line costs. Streams the file (recordings can be large); ``OSError`` if it cannot be read.
    """
    with Path(path).open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip(b"\r\n")
            if not line.strip():
                continue
            try:
                yield number, line, decode(line)
            except ProtocolError as exc:
                yield number, line, exc
