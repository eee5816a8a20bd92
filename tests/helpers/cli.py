"""The ``tuimon`` command as a real process, and a real terminal (a pty) for it to draw on."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Sequence
from pathlib import Path

#: The `tuimon` command, run by this interpreter.
TUIMON = [sys.executable, "-m", "tuimon.cli"]
#: Training scripts the tests run as real programs.
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def tuimon_run_command(
    tmp_path: Path, command: list[str], run: str, options: Sequence[str] = ()
) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    """``tuimon run --record`` a command as a real subprocess (``options``: more of ``tuimon run``'s);
    its result and its recordings."""
    prefix = tmp_path / "rec" / "exp"
    result = subprocess.run(
        [*TUIMON, "run", "--run", run, "--record", str(prefix), "--gpu", "none", *options, "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    recordings = sorted(prefix.parent.glob("exp.rank*.jsonl")) if prefix.parent.exists() else []
    return result, recordings



class Terminal:
    """A pty of 160x48 with a `tuimon` process on it; reads its output so it never blocks."""

    def __init__(self, args: list[str], env: dict[str, str], *, controlling: bool) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
        self.master: int | None = master
        self.output = b""

        def become_session_leader_of_the_tty() -> None:
            os.setsid()
            if controlling:  # like sshd: the pty is the session's controlling terminal
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(
            [*TUIMON, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "xterm-256color", **env},
            preexec_fn=become_session_leader_of_the_tty,
        )
        os.close(slave)

    def read_until(self, text: bytes, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            assert time.monotonic() < deadline, f"{text!r} never shown; got {self.output[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                self.output += os.read(self.master, 65536)

    def close(self) -> None:
        if self.master is not None:
            os.close(self.master)
            self.master = None

    def kill(self) -> None:
        self.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
