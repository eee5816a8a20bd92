"""Alerts beyond the screen, from real parts: a real Publisher over 127.0.0.1, `tuimon tail` as a
subprocess, a real webhook (http.server on a free loopback port, which can fail or hang), a real
command (this interpreter writing its stdin to a file), and the real dashboard (Textual's
`run_test`, and `tuimon watch` on a pty).

What must hold: a live event at or above the level alerts once an episode, with a Slack-compatible
body; the joining snapshot's older events never alert; failures are retried; a target that hangs never
delays what tail prints, and what it cannot take is dropped and said; the dashboard in the
background tells its terminal.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import TUIMON, Terminal
from helpers.runs import RunBuilder
from helpers.waiting import wait_for_screen, wait_until
from textual import events

from publisher.wire.transport import Publisher
from tuimon.notify.courier import QUEUE_SIZE
from tuimon.notify.notifier import Notifier
from tuimon.notify.settings import NotifySettings
from tuimon.notify.tap import AlertingLiveSource
from tuimon.sink import Batch, News, Notice, Sink, Snapshot
from tuimon.ui.app import TuimonApp
from tuimon.ui.services.desktop_notify import notify_in_background

#: A --notify-cmd: this interpreter appending its stdin, as one line, to the file named after it.
APPEND_STDIN = "import sys; open(sys.argv[1], 'ab').write(sys.stdin.buffer.read() + b'\\n')"
#: The same, except that its first run fails (exit status 3) and leaves a mark.
FAIL_ONCE = (
    "import os, sys\n"
    "if not os.path.exists(sys.argv[2]):\n"
    "    open(sys.argv[2], 'w').close(); sys.exit(3)\n"
    "open(sys.argv[1], 'ab').write(sys.stdin.buffer.read() + b'\\n')"
)


class Hook:
    """A webhook on 127.0.0.1: records each POST's JSON body; the first ``fail_first`` requests get
    a 500, and with ``hang`` every request waits until :meth:`close`."""

    def __init__(self, *, fail_first: int = 0, hang: bool = False) -> None:
        self.posts: list[dict[str, Any]] = []
        self.requests = 0
        self.released = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests += 1
                if hang:
                    hook.released.wait(60)
                failing = hook.requests <= fail_first
                if not failing:
                    assert self.headers["Content-Type"] == "application/json"
                    hook.posts.append(json.loads(body))
                self.send_response(500 if failing else 200)
                self.end_headers()
                self.wfile.write(b"no" if failing else b"ok")

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T0/B0/secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ids(self) -> list[str]:
        return [post.get("id", post["type"]) for post in self.posts]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[Callable[..., Hook]]:
    started: list[Hook] = []

    def start(**options: Any) -> Hook:
        started.append(Hook(**options))
        return started[-1]

    yield start
    for hook in started:
        hook.close()


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config folder of the test's own: the developer's [notify] never alerts from a test."""
    folder = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder))
    return folder


def send_event(publisher: Publisher, event_id: str, severity: str, *, count: int = 1,
               kind: str = "loss_spike") -> None:
    publisher.publish("event", step=10, id=event_id, count=count, severity=severity, kind=kind,
                      message=f"{event_id} says hello", details={"ratio": 4.2})


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    """A real Publisher mid-run, with one warning already sent: only the snapshot will have it."""
    publisher = Publisher("alerted", heartbeat_s=0.2)
    try:
        publisher.publish("run_start", config={}, world_size=1, gpu_source="none")
        send_event(publisher, "old", "warning")
        wait_until(lambda: publisher.stats()["sent"] >= 2, what="the history sent")
        yield publisher
    finally:
        publisher.close()


class Tail:
    """`tuimon tail ARGS` in a subprocess; a thread reads its lines as they come, with the time."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([*TUIMON, "tail", *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, bufsize=0)
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), json.loads(line)))

    def printed(self, test: Callable[[dict[str, Any]], bool]) -> float | None:
        """When the first message passing ``test`` was printed (None: not yet)."""
        return next((when for when, message in list(self.lines) if test(message)), None)

    def wait_printed(self, test: Callable[[dict[str, Any]], bool], what: str) -> float:
        wait_until(lambda: self.printed(test) is not None, 30, what)
        when = self.printed(test)
        assert when is not None
        return when

    def stop(self, timeout_s: float = 30) -> str:
        """SIGTERM, as a service manager ends it; its stderr once it has exited (exit 0)."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=timeout_s) == 0
        self._reader.join(10)
        assert self.process.stderr is not None
        return self.process.stderr.read().decode()


def event_id(target: str) -> Callable[[dict[str, Any]], bool]:
    return lambda message: message["type"] == "event" and message["id"] == target


def recorded(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_a_live_warning_alerts_once_by_webhook_and_command_and_nothing_else_does(
    publisher: Publisher, hooks: Callable[..., Hook], tmp_path: Path
) -> None:
    hook, out = hooks(), tmp_path / "alerts.jsonl"
    command = shlex.join([sys.executable, "-c", APPEND_STDIN, str(out)])
    tail = Tail(publisher.endpoint, "--notify-url", hook.url, "--notify-cmd", command)
    tail.wait_printed(event_id("old"), "the snapshot's event printed")
    send_event(publisher, "i1", "info")
    send_event(publisher, "w1", "warning")
    send_event(publisher, "w1", "warning", count=2)  # the same episode, updated
    send_event(publisher, "old", "warning", count=2)  # an episode from before joining, updated
    send_event(publisher, "c1", "critical", kind="nonfinite_loss")
    tail.wait_printed(event_id("c1"), "the last event printed")
    wait_until(lambda: len(hook.posts) >= 2 and len(recorded(out)) >= 2, 30, "two alerts")
    stderr = tail.stop()  # what was queued is delivered before it exits

    assert hook.ids() == ["w1", "c1"]
    warning = hook.posts[0]
    assert warning["text"] == (
        f"tuimon: WARNING loss_spike: w1 says hello (run alerted, rank 0 on {publisher.host}, step 10)"
    )
    assert {key: warning[key] for key in ("type", "run", "rank", "id", "severity", "kind", "count")} == {
        "type": "event", "run": "alerted", "rank": 0, "id": "w1", "severity": "warning",
        "kind": "loss_spike", "count": 1,
    }
    assert warning["details"] == {"ratio": 4.2} and warning["message"] == "w1 says hello"
    assert hook.posts[1]["text"].startswith("tuimon: CRITICAL nonfinite_loss: c1 says hello")
    assert recorded(out) == hook.posts  # the command got the same JSON on its stdin
    port = hook.url.split(":")[2].split("/")[0]
    assert (f"command {sys.executable}: 2 delivered, 0 failed, 0 dropped; "
            f"webhook http://127.0.0.1:{port}: 2 delivered, 0 failed, 0 dropped") in stderr
    assert "secret" not in stderr  # a webhook's path is its key: never shown
    assert stderr.strip().splitlines()[-1].startswith(f"tuimon tail: {len(tail.lines)} messages printed")


def test_the_level_comes_from_the_config_file_and_the_command_line_wins(
    publisher: Publisher, hooks: Callable[..., Hook], config_home: Path
) -> None:
    hook = hooks()
    (config_home / "tuimon").mkdir(parents=True)
    (config_home / "tuimon" / "config.toml").write_text(f'[notify]\nurl = "{hook.url}"\nlevel = "warning"\n')
    tail = Tail(publisher.endpoint, "--notify-level", "critical")
    tail.wait_printed(event_id("old"), "the snapshot's event printed")
    send_event(publisher, "w1", "warning")
    send_event(publisher, "c1", "critical")
    tail.wait_printed(event_id("c1"), "the last event printed")
    wait_until(lambda: hook.posts, 30, "the critical alert")
    tail.stop()
    assert hook.ids() == ["c1"]


def test_a_bad_setting_is_one_line_before_anything_starts(config_home: Path) -> None:
    (config_home / "tuimon").mkdir(parents=True)
    (config_home / "tuimon" / "config.toml").write_text('[notify]\nurl = "ftp://example.com/hook"\n')
    tail = [*TUIMON, "tail", "5555", "--for", "1"]
    done = subprocess.run(tail, capture_output=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().strip() == (
        f"tuimon: error: url in [notify] of {config_home / 'tuimon' / 'config.toml'}: "
        "expected an http:// or https:// URL, got 'ftp://example.com/hook'"
    )
    done = subprocess.run([*TUIMON, "tail", "5555", "--notify-cmd", "no-such-command --x"],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.decode().strip() == "tuimon: error: --notify-cmd: command not found: no-such-command"


def test_failures_are_retried_until_the_alert_arrives(
    publisher: Publisher, hooks: Callable[..., Hook], tmp_path: Path
) -> None:
    hook, out, mark = hooks(fail_first=2), tmp_path / "alerts.jsonl", tmp_path / "failed-once"
    command = shlex.join([sys.executable, "-c", FAIL_ONCE, str(out), str(mark)])
    tail = Tail(publisher.endpoint, "--notify-url", hook.url, "--notify-cmd", command)
    tail.wait_printed(event_id("old"), "the snapshot's event printed")
    send_event(publisher, "w1", "warning")
    wait_until(lambda: hook.posts and recorded(out), 30, "the alert, after retries")
    stderr = tail.stop()

    assert hook.requests == 3 and hook.ids() == ["w1"]  # two 500s, then the alert
    assert mark.exists() and [alert["id"] for alert in recorded(out)] == ["w1"]  # exit 3, then the alert
    assert "1 delivered, 0 failed, 0 dropped" in stderr and "failed after" not in stderr


def test_a_hanging_webhook_never_delays_tail_and_what_it_cannot_take_is_dropped_and_said(
    publisher: Publisher, hooks: Callable[..., Hook]
) -> None:
    hook = hooks(hang=True)
    tail = Tail(publisher.endpoint, "--notify-url", hook.url, "--notify-rate", "1000")
    tail.wait_printed(event_id("old"), "the snapshot's event printed")
    send_event(publisher, "w0", "warning")
    wait_until(lambda: hook.requests == 1, 30, "the webhook holding the first alert")
    for number in range(1, QUEUE_SIZE + 6):  # a full queue behind it, and 5 more
        send_event(publisher, f"w{number}", "warning")
    delays = []
    for step in range(5):  # while it hangs, each message is printed at once
        sent = time.monotonic()
        publisher.publish("metrics", step=step, metrics={"loss": 1.0})
        delays.append(tail.wait_printed(lambda m, s=step: m["type"] == "metrics" and m["step"] == s,
                                        "a later message printed") - sent)
    stopping = time.monotonic()
    stderr = tail.stop()

    assert max(delays) < 1.0, delays
    assert time.monotonic() - stopping < 15  # the hung webhook holds only its own thread
    port = hook.url.split(":")[2].split("/")[0]
    webhook = f"webhook http://127.0.0.1:{port}"
    assert f"tuimon tail: alert to {webhook} dropped: {QUEUE_SIZE} already waiting" in stderr
    assert "not delivered before closing" in stderr
    assert "0 delivered, 0 failed" in stderr and "secret" not in stderr


class Board(Sink):
    """Where a notifier says its problems (the notices a sink is told)."""

    def __init__(self) -> None:
        self.notices: dict[str, str] = {}

    def tell(self, news: News) -> None:
        if isinstance(news, Notice) and news.text is not None:
            self.notices[news.key] = news.text


def test_the_rate_limit_holds_a_burst_back_and_sums_it_up_once_the_minute_is_over(
    hooks: Callable[..., Hook],
) -> None:
    hook, now = hooks(), [1000.0]
    notifier = Notifier(NotifySettings(url=hook.url, per_minute=2), Board(), clock=lambda: now[0])
    builder = RunBuilder("burst", t0=time.time())

    def event(number: int, kind: str = "nonfinite_loss") -> dict[str, Any]:
        return builder.message("event", step=number, id=f"e{number}", severity="critical", kind=kind,
                               message=f"event {number}", details={}, count=1)

    notifier.start()
    try:
        notifier.heard(Batch([event(1), event(2), event(3), event(4, "loss_spike"), event(5)]))
        wait_until(lambda: len(hook.posts) == 2, 30, "the first two alerts")
        time.sleep(1.0)  # the summary waits for the window, not for more events
        assert hook.ids() == ["e1", "e2"]
        now[0] += 60.0
        wait_until(lambda: len(hook.posts) == 3, 30, "the summary")
        notifier.heard(Batch([event(6)]))
        wait_until(lambda: len(hook.posts) == 4, 30, "the next alert")
    finally:
        notifier.close()

    summary = hook.posts[2]
    assert summary["type"] == "alerts_suppressed" and summary["count"] == 3
    assert summary["kinds"] == {"nonfinite_loss": 2, "loss_spike": 1}
    assert summary["text"] == ("tuimon: alerts suppressed: 3 more alerts suppressed (at most 2 a minute): "
                               "nonfinite_loss ×2, loss_spike ×1")
    assert hook.ids()[3] == "e6"


def test_a_relays_account_of_the_past_never_alerts_but_its_filtered_live_stream_does(
    hooks: Callable[..., Hook],
) -> None:
    hook = hooks()
    notifier = Notifier(NotifySettings(url=hook.url), Board())
    old, live = RunBuilder("job", rank=7, t0=notifier.since - 30), RunBuilder("job", rank=9, t0=time.time())
    body = {"severity": "warning", "kind": "straggler", "message": "slow", "details": {}, "count": 1}
    notifier.start()
    try:
        # The relay's job state and a filtered live batch reach a sink alike (complete=False).
        notifier.heard(Batch([old.message("event", id="old", **body)], complete=False))
        notifier.heard(Batch([live.message("event", id="new", **body)], complete=False))
        wait_until(lambda: hook.posts, 30, "the live alert")
    finally:
        notifier.close()
    assert hook.ids() == ["new"]


def test_a_snapshots_events_alert_only_if_made_since_the_viewer_started(
    hooks: Callable[..., Hook],
) -> None:
    """A snapshot holds what its sender published before serving it: an event made while this
    viewer was joining reaches it in the snapshot only, and is news; an older one is history."""
    hook = hooks()
    notifier = Notifier(NotifySettings(url=hook.url), Board())
    old = RunBuilder("late", rank=0, t0=notifier.since - 30)
    joining = RunBuilder("late", rank=0, t0=time.time())
    body = {"severity": "warning", "kind": "loss_spike", "message": "spike", "details": {}, "count": 1}
    history = [old.run_start(), old.message("event", id="old", **body),
               joining.message("event", id="new", **body)]
    notifier.start()
    try:
        notifier.heard(Batch(history, snapshot=Snapshot("late", 0, seq=2, size=len(history))))
        wait_until(lambda: hook.posts, 30, "the alert of the event made while joining")
    finally:
        notifier.close()
    assert hook.ids() == ["new"]


def test_slack_formatting_from_peers_is_escaped_and_their_extra_fields_are_left_out(
    hooks: Callable[..., Hook],
) -> None:
    hook = hooks()
    notifier = Notifier(NotifySettings(url=hook.url), Board())
    hostile = RunBuilder("job", t0=time.time()).message(
        "event", id="x", severity="critical", kind="nan", message="<!channel> & co", details={}, count=1,
        blocks=[{"type": "section"}], channel="#general",
    )
    notifier.start()
    try:
        notifier.heard(Batch([hostile]))
        wait_until(lambda: hook.posts, 30, "the alert")
    finally:
        notifier.close()
    [post] = hook.posts
    assert post["text"].startswith("tuimon: CRITICAL nan: &lt;!channel&gt; &amp; co (run job")
    assert "blocks" not in post and "channel" not in post and post["message"] == "<!channel> & co"


async def test_the_dashboard_alerts_live_events_and_tells_its_terminal_when_in_the_background(
    hooks: Callable[..., Hook],
) -> None:
    hook = hooks()
    publisher = Publisher("dash", heartbeat_s=0.2)
    try:
        publisher.publish("run_start", config={}, world_size=1, gpu_source="none")
        send_event(publisher, "old", "warning")
        wait_until(lambda: publisher.stats()["sent"] >= 2, what="the history sent")
        source = AlertingLiveSource([publisher.endpoint], alerts=NotifySettings(url=hook.url))
        app = TuimonApp(source)
        notify_in_background(app, source.notifier)  # what `tuimon watch` does (run_dashboard)
        async with app.run_test(size=(160, 48)) as pilot:
            driver = app._driver
            assert driver is not None
            written: list[str] = []
            write = driver.write

            def recording_write(data: str) -> None:  # what reaches the driver, then on to it
                written.append(data)
                write(data)

            driver.write = recording_write
            await wait_for_screen(pilot, lambda: app.store.event("dash", "old") is not None,
                                  what="the snapshot applied")
            send_event(publisher, "w1", "warning")
            await wait_for_screen(pilot, lambda: hook.ids() == ["w1"], what="the live alert posted")
            await pilot.pause(0.5)
            assert not [data for data in written if "\x1b]9;" in data]  # in the foreground: the log says it

            app.post_message(events.AppBlur())  # what Textual posts when the terminal reports focus out
            await wait_for_screen(pilot, lambda: not app.app_focus, what="the app in the background")
            send_event(publisher, "c1", "critical", kind="nonfinite_loss")
            await wait_for_screen(pilot, lambda: [data for data in written if "\x1b]9;" in data],
                                  what="the desktop notification")
            await wait_for_screen(pilot, lambda: hook.ids() == ["w1", "c1"], what="the second alert")
    finally:
        publisher.close()

    [osc] = [data for data in written if "\x1b]9;" in data]
    assert osc == (
        f"\x1b]9;tuimon: CRITICAL nonfinite_loss: c1 says hello (run dash, rank 0 on {publisher.host}, "
        "step 10)\x07"
    )


def pump(terminal: Terminal) -> None:
    """Read what the dashboard wrote so far (it must never block on a full pty)."""
    while terminal.master is not None and select.select([terminal.master], [], [], 0.05)[0]:
        terminal.output += os.read(terminal.master, 65536)


def test_tuimon_watch_on_a_terminal_in_the_background_writes_a_desktop_notification(
    hooks: Callable[..., Hook],
) -> None:
    hook = hooks()
    publisher = Publisher("bg", heartbeat_s=0.2)
    terminal = Terminal(["watch", publisher.endpoint, "--notify-url", hook.url, "--notify-desktop", "osc777"],
                        {}, controlling=False)
    try:
        publisher.publish("run_start", config={}, world_size=1, gpu_source="none")
        terminal.read_until(b"Quit")
        assert b"\x1b[?1004h" in terminal.output  # Textual asked the terminal to report its focus
        send_event(publisher, "w1", "warning")
        wait_until(lambda: hook.ids() == ["w1"], 30, "the live alert", tick=lambda: pump(terminal))
        time.sleep(0.5)
        pump(terminal)
        assert b"\x1b]777;" not in terminal.output  # in the foreground: no notification

        assert terminal.master is not None
        os.write(terminal.master, b"\x1b[O")  # the terminal reports focus out (DEC mode 1004)
        time.sleep(0.5)
        send_event(publisher, "c1", "critical", kind="nonfinite_loss")
        terminal.read_until(b"\x1b]777;notify;tuimon: CRITICAL nonfinite_loss;c1 says hello (run bg, rank 0")
        assert terminal.process.poll() is None
    finally:
        terminal.kill()
        publisher.close()
