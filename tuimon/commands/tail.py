"""``tuimon tail``: a live run's messages as JSON Lines on stdout, for ``jq``, scripts and tests.

It listens exactly as the dashboard does (the same :class:`~tuimon.sources.receiver.Receiver`:
same discovery, same validation, same snapshot for late joiners), so what it prints is what a
viewer would have applied, in the same order: a late joiner's snapshot first, then live messages
newer than it. Only the sink differs: :class:`LinePrinter` writes each message instead of storing
it. Messages that fail validation are counted by reason, never printed, so a consumer can trust
every line.

With ``--notify-*`` (or ``[notify]`` in the config file) live events also alert, headless, exactly
as from the dashboard (:mod:`tuimon.notify`): the printer is wrapped, not replaced, and problems
with the alerts are said on stderr like the other notices.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from tuimon.commands._options import (
    WrappedHelp,
    add_keys_option,
    add_notify_options,
    keys_from,
    notify_settings,
    positive_seconds,
)
from tuimon.commands._receiving import receive_until, stopped_by_signals
from tuimon.sink import Batch, News, Notice, Sink

#: The exit status when nothing was heard (as grep's when nothing matched).
NOTHING_HEARD = 1

_EXAMPLES = """\
examples:
  tuimon tail tcp://127.0.0.1:5555 | jq -c 'select(.type == "metrics") | [.step, .metrics.loss]'
  tuimon tail --for 10 > runs.jsonl      (ten seconds of every run on this host)
  tuimon tail 5555 | head -3             (the run's start and its first messages)
  tuimon tail --notify-url https://hooks.slack.com/services/... > /dev/null   (alerts, headless)"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tail",
        help="print a live run's messages as JSON lines (for jq and scripts)",
        description="Print every message of a live run on stdout, one compact JSON object a line, "
        "flushed at once: the run's snapshot first (its start, metric history, events), then live "
        "messages. Without ADDR, every run registered on this host, including runs started later. "
        "Messages that fail the protocol's checks are counted, not printed; a one-line summary "
        "goes to stderr at the end. Runs until --for runs out, Ctrl-C, SIGTERM or the reader "
        "closes stdout: exit status 0, or 1 when nothing was heard.",
        epilog=_EXAMPLES,
        formatter_class=WrappedHelp,
    )
    parser.add_argument(
        "address",
        nargs="?",
        metavar="ADDR",
        help="publisher address: tcp://HOST:PORT, HOST:PORT or PORT (on 127.0.0.1); "
        "default: every run in the run registry",
    )
    parser.add_argument(
        "--for",
        dest="duration",
        type=positive_seconds,
        metavar="SECONDS",
        help="stop after this many seconds (default: run until interrupted)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="through a relay, every rank's every message (by default a relay sends what the job "
        "view takes: node summaries, events, starts and ends, and rank 0's full stream)",
    )
    add_keys_option(parser)
    add_notify_options(parser, desktop=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tuimon.notify.notifier import Notifier
    from tuimon.notify.tap import AlertingSink
    from tuimon.sources.live import listen_targets
    from tuimon.sources.subscriptions import Subscriptions

    # A bad address, an unusable registry folder or a bad alert setting fails here, as one line,
    # before any socket.
    endpoints, registry_dir = listen_targets([] if args.address is None else [args.address])
    keys, explicit = keys_from(args)
    alerts = notify_settings(args)
    stop = threading.Event()
    printer = LinePrinter(sys.stdout.buffer, sys.stderr, on_closed=stop.set)
    notifier = Notifier(alerts, printer) if alerts.external else None
    sink: Sink = printer if notifier is None else AlertingSink(printer, notifier)
    timer = threading.Timer(args.duration, stop.set) if args.duration is not None else None
    # Ctrl-C and SIGTERM end the command like --for does: sockets closed, summary printed, exit 0.
    with stopped_by_signals(stop):
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            if notifier is not None:
                notifier.start()
            subscriptions = Subscriptions(follow_relays=not args.all)
            receive_until(stop, sink, endpoints, registry_dir, keys, explicit, subscriptions)
        finally:
            if timer is not None:
                timer.cancel()
            if notifier is not None:
                notifier.close()
    if notifier is not None:
        print(f"tuimon tail: {notifier.summary()}", file=sys.stderr, flush=True)
    print(f"tuimon tail: {printer.summary()}", file=sys.stderr, flush=True)
    if printer.printed == 0:
        where = args.address or "this host's run registry"
        print(f"tuimon tail: nothing heard from {where}: is a run publishing there? (`tuimon watch` "
              "lists this host's runs)", file=sys.stderr, flush=True)
        return NOTHING_HEARD
    return 0


class LinePrinter(Sink):
    """A :class:`~tuimon.sink.Sink` that prints instead of storing.

    Each message is re-encoded compactly (the protocol's own encoder) and flushed on its own line,
    so a reader sees it at once. When the reader goes away (``| head``), printing stops quietly,
    stdout is pointed at /dev/null (so the interpreter's last flush cannot fail either) and
    ``on_closed`` is called to end the command. Notices (a snapshot that did not come, an address
    that stays silent) go to ``errors`` once each while they last.
    """

    def __init__(
        self, out: IO[bytes], errors: IO[str], *, on_closed: Callable[[], object] | None = None
    ) -> None:
        from publisher.wire.protocol import encode

        self._encode = encode
        self._out = out
        self._errors = errors
        self._on_closed = on_closed
        self._notices: dict[str, float | None] = {}  # key -> when it lapses (monotonic), None: never
        self.printed = 0
        self.malformed: Counter[str] = Counter()
        self.closed = False

    def deliver(self, batch: Batch) -> None:
        for error, _ in batch.malformed:
            self.malformed[error.reason] += 1
        self._print(batch.messages)

    def tell(self, news: News) -> None:
        """Notices go to ``errors``; the source's status is not shown (the summary at the end
        says what happened)."""
        if not isinstance(news, Notice):
            return
        now = time.monotonic()
        lapses = self._notices.get(news.key, now)
        if news.text is None:
            self._notices.pop(news.key, None)
            return
        self._notices[news.key] = None if news.ttl_s is None else now + news.ttl_s
        if lapses is not None and lapses <= now:  # new, or lapsed since it was last said
            print(f"tuimon tail: {news.text}", file=self._errors, flush=True)

    def summary(self) -> str:
        """What was printed and what was refused, by reason, in one line."""
        total = sum(self.malformed.values())
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.malformed.items()))
        return f"{self.printed} messages printed, {total} malformed" + (f" ({reasons})" if reasons else "")

    def _print(self, messages: Iterable[Mapping[str, Any]]) -> None:
        if self.closed:
            return
        out, encode = self._out, self._encode
        try:
            for message in messages:
                out.write(encode(message) + b"\n")
                out.flush()
                self.printed += 1
        except BrokenPipeError:
            self.closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)
            if self._on_closed is not None:
                self._on_closed()
