"""Where alerts go: an HTTP webhook and a local command, each one attempt at a time.

A target makes one attempt and raises :class:`DeliveryError` saying whether another is worth it
(:mod:`tuimon.notify.courier` retries, with backoff, on a thread of its own). Worth retrying: a
webhook's 5xx or 429, a refused or dropped connection, a timeout; a command's non-zero exit status
or timeout. Not: a 4xx (the URL or the body is wrong; trying again changes nothing) or a command
that cannot be started.
"""

from __future__ import annotations

import http.client
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from typing import Protocol

import tuimon
from tuimon.notify.alert import Alert

#: Seconds a webhook has to answer one attempt.
HTTP_TIMEOUT_S = 10.0
#: Seconds a command may run for one alert before it is killed (and the attempt counts as failed).
COMMAND_TIMEOUT_S = 30.0
#: Characters of a command's stderr quoted when it fails.
STDERR_QUOTED = 200


class DeliveryError(Exception):
    """One attempt failed; ``retry``: whether another attempt may succeed."""

    def __init__(self, reason: str, *, retry: bool) -> None:
        super().__init__(reason)
        self.retry = retry


class Target(Protocol):
    """Something an alert can be handed to, one attempt per :meth:`send`."""

    @property
    def name(self) -> str:
        """How messages about it name it."""

    def send(self, alert: Alert) -> None:
        """One attempt; raises :class:`DeliveryError`."""


class Webhook:
    """POSTs :meth:`Alert.body` as ``application/json`` (a Slack-compatible incoming webhook).

    Its :attr:`name` is the scheme, host and port only: a Slack webhook's path is its secret, and
    failures are shown on screens and in logs."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urllib.parse.urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
        self.name = f"webhook {parts.scheme}://{parts.hostname}{port}"

    def send(self, alert: Alert) -> None:
        request = urllib.request.Request(
            self.url,
            data=alert.body(),
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": f"tuimon/{tuimon.__version__}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                response.read()
        except urllib.error.HTTPError as exc:  # an answer, but not a success
            retry = exc.code >= 500 or exc.code == 429  # the server's trouble, or "slow down"
            raise DeliveryError(f"HTTP {exc.code} {exc.reason}", retry=retry) from None
        except urllib.error.URLError as exc:
            raise DeliveryError(str(exc.reason), retry=True) from None
        except (OSError, http.client.HTTPException) as exc:  # a timeout, a connection cut mid-answer
            raise DeliveryError(str(exc) or type(exc).__name__, retry=True) from None


class Command:
    """Runs ``argv`` (no shell) with :meth:`Alert.body` on its stdin.

    Its stdout is discarded: ``tuimon tail`` prints JSON lines there, and the dashboard owns the
    terminal. It runs in a session of its own, so a Ctrl-C meant for tuimon does not cut an alert
    short; its stderr's last line says why it failed."""

    def __init__(self, argv: tuple[str, ...]) -> None:
        self.argv = argv
        self.name = f"command {argv[0]}"

    def send(self, alert: Alert) -> None:
        try:
            done = subprocess.run(
                self.argv, input=alert.body(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                timeout=COMMAND_TIMEOUT_S, check=False, start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"still running after {COMMAND_TIMEOUT_S:g} s (killed)", retry=True) from None
        except OSError as exc:
            raise DeliveryError(f"cannot run it: {exc.strerror or exc}", retry=False) from None
        if done.returncode != 0:
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            said = f": {last[0][:STDERR_QUOTED]}" if last else ""
            raise DeliveryError(f"exit status {done.returncode}{said}", retry=True)
