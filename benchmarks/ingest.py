"""How much live traffic the viewer absorbs, and whether its screen keeps up while it does.

    python benchmarks/ingest.py [--rates 10000,50000,100000] [--seconds 5]
    python benchmarks/ingest.py --against REV [--pairs 3] [--rates 50000 --seconds 8]

``--against REV`` compares this tree with commit ``REV`` in one run: alternating runs of each
(REV's own copy of this script, in a temporary git worktree), then per rate the median and the
spread of the screen delay p95, the key press p95, what was absorbed and what was lost. Run it
before committing a change that touches the viewer (``--against HEAD``) and when a figure moved.

A publisher in its own process sends pre-encoded, valid ``metrics`` messages (one per step) at a
fixed target rate on a real PUB socket, with a heartbeat every second carrying its drop count (and
on after the traffic, as a training process beats until it ends, until the viewer has drained). The
viewer is the real thing in this process: ``LiveSource`` (receiver thread) + ``Store`` + the
Textual dashboard running headless (``App.run_test``) at 160x48. For each rate the table gives:

- absorbed: messages the viewer took in per second, from the first sent to the last received (a
  viewer that falls behind keeps draining after the sender stopped, which lowers the rate), and
  the share of those sent that it had taken in within 10 s of the end;
- pub drops / lost: not sent because the PUB's high-water mark was reached (from the heartbeat) /
  never received, as the viewer counts them (gaps in ``seq``: those drops, and the viewer's receive
  queue overflowing) and shows them on its status line; a line after the table gives, for a rate
  that lost any, what the status line said and how many were lost without being counted;
- key ms: a key press that redraws the chart (``c``), from the key event entering the app's queue
  to its action done, median and p95; x idle: its ratio to the same press right after the
  traffic stopped, with the same data on screen (the baseline, measured in the same run);
- timer late ms: p95 lateness of a 100 ms UI timer (how jerky the screen gets);
- screen delay s: age of the step shown in the header (now minus the time that step was
  published), sampled every 100 ms: median, p95 and max.

Targets: 50,000 msg/s absorbed; screen at most 0.5 s behind. Numbers on a shared machine are
provisional: the publisher and the viewer compete with everything else for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _against
from textual import events

from tuimon.sources.live import LiveSource
from tuimon.store.records import Counters
from tuimon.ui.app import TuimonApp

RUN = "bench"
#: The publisher: binds, prints its endpoint, waits for "go", then sends at the target rate for the
#: given seconds, a heartbeat every second, and prints "sent dropped" at the end.
PUBLISHER = r"""
import select, sys, time, zmq
from publisher.wire.protocol import decode, encode, make_message
rate, seconds, hostile = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "hostile"
context = zmq.Context()
pub = context.socket(zmq.PUB)
pub.sndhwm = 100_000
pub.bind("tcp://127.0.0.1:*")
print(pub.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
sys.stdin.readline()
template = (b'{"v":1,"type":"metrics","run":"bench","rank":0,"host":"bench","ts":%.6f,"seq":%d,'
            b'"step":%d,"metrics":{"loss":%.5f,"sent_at":%.6f}}')
decode(template % (1.0, 0, 0, 1.0, 1.0))  # the frames are valid protocol
seq = sent = dropped = 0
def odd_message(step, ts):
    # What a buggy or hostile peer sends: new metric names every time, new event ids, non-finite
    # GPU readings, nested details, and frames that are not protocol at all.
    envelope = dict(run="bench", rank=0, host="bench", ts=ts, seq=seq)
    choice = (step // 5) % 5
    if choice == 0:
        return encode(make_message("metrics", step=step, **envelope,
                                   metrics={f"m{step}_{i}": float(i) for i in range(200)}))
    if choice == 1:
        details = {"tree": {"a": {"b": {"c": {"d": list(range(50))}}}}}
        return encode(make_message("event", step=step, **envelope, id=f"e{step}", severity="warning",
                                   kind=f"kind{step % 97}", message="x" * 200, details=details, count=1))
    if choice == 2:
        devices = [{"index": i, "util": "inf", "temp_c": "nan", "mem_used": "-inf", "mem_total": 0}
                   for i in range(64)]
        return encode(make_message("gpu", step=step, **envelope, devices=devices))
    if choice == 3:
        return b'{"v":1,"type":["metrics"],"run":"bench"}'
    return b"[" * 2000
def send(frame):
    global seq, sent, dropped
    try:
        pub.send(frame, zmq.NOBLOCK)
        sent += 1
    except zmq.Again:
        dropped += 1
    seq += 1
def heartbeat(step):
    stats = {"sent": sent, "dropped": dropped, "queued": 0, "recorded": 0}
    send(encode(make_message("heartbeat", run="bench", rank=0, host="bench", ts=time.time(), seq=seq,
                             step=step, snapshot="tcp://127.0.0.1:9", stats=stats)))
send(encode(make_message("run_start", run="bench", rank=0, host="bench", ts=time.time(), seq=0,
                         config={}, world_size=1, gpu_source="none")))
start = time.perf_counter()
step = 0
next_beat = start + 1.0
while True:
    now = time.perf_counter()
    if now - start >= seconds:
        break
    due = int((now - start) * rate)
    while step < due:
        ts = time.time()
        if hostile and step % 5 == 1:
            send(odd_message(step, ts))
        send(template % (ts, seq, step, 1.0 / (1 + step), ts))
        step += 1
    if now >= next_beat:
        heartbeat(step - 1)
        next_beat += 1.0
    time.sleep(0.0005)
heartbeat(step - 1)
print(sent, dropped, step, flush=True)
# As a training process does, it goes on beating until it ends: a viewer that lost the last
# messages from its queue learns of them from the next beat's seq.
while not select.select([sys.stdin], [], [], 0.5)[0]:
    heartbeat(step - 1)
sys.stdin.readline()
print(sent, dropped, flush=True)
"""


@dataclass
class Result:
    rate: int
    sent: int
    steps: int
    pub_dropped: int
    received: int
    lost: int
    seconds: float  # from the first message sent to the last one received
    key_ms: list[float]
    idle_key_ms: list[float]
    timer_late_ms: list[float]
    delays_s: list[float]
    malformed: int
    shown_gaps: int | None  # what the status line said at the end ("gaps N"), None if it said none

    @property
    def uncounted(self) -> int:
        """Messages given a sequence number (sent or dropped by the publisher) that the viewer neither
        received nor counted as a gap: lost without anyone being told."""
        return self.sent + self.pub_dropped - (self.received - self.malformed) - self.lost


def accounted(counters: Counters) -> int:
    """Messages numbered by the publisher that the viewer has taken in whole or counted as lost: a
    malformed frame (hostile traffic) is received, and its number is a gap."""
    return counters.received - counters.malformed + counters.gaps


def shown_step(app: TuimonApp) -> int | None:
    header = str(app.query_one("#header").visual)
    value = header.split("step ")[1].split()[0].replace(",", "") if "step " in header else ""
    return int(value) if value.isdigit() else None


def published_at(app: TuimonApp, step: int) -> float | None:
    """When ``step`` was published (the publisher puts it in the message as ``sent_at``)."""
    steps, values = app.store.metric_window(RUN, step, before=0, after=0, names=["sent_at"]).get(
        "sent_at", ([], [])
    )
    return values[0] if steps else None


class ChartKeyProbe:
    """Notes when the dashboard's chart key (``c``) has run its action, the chart redrawn; the
    action belongs to the dashboard screen, which is wrapped on the instance."""

    def __init__(self, app: TuimonApp) -> None:
        self.app = app
        self.handled = 0.0
        dashboard = app.dashboard
        original = dashboard.action_next_chart

        def next_chart() -> None:
            original()
            self.handled = time.perf_counter()

        dashboard.action_next_chart = next_chart  # type: ignore[method-assign]

    async def press_ms(self) -> float:
        """From the key event entering the app's queue to its action done (the chart redrawn)."""
        before = self.handled
        started = time.perf_counter()
        self.app.post_message(events.Key("c", "c"))
        while self.handled == before:
            await asyncio.sleep(0.001)
            if time.perf_counter() - started > 10:
                return float("nan")
        return (self.handled - started) * 1000


async def measure(rate: int, seconds: float, traffic: str) -> Result:
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, str(rate), str(seconds), traffic],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    endpoint = publisher.stdout.readline().strip()
    source = LiveSource([endpoint])
    app = TuimonApp(source)
    key_ms: list[float] = []
    late_ms: list[float] = []
    delays: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        probe = ChartKeyProbe(app)
        await pilot.pause(0.5)  # the SUB connects before the first message is sent
        last_tick = [time.perf_counter()]

        def tick() -> None:
            now = time.perf_counter()
            late_ms.append(max(0.0, (now - last_tick[0] - 0.1) * 1000))
            last_tick[0] = now

        store = app.store
        progress: list[tuple[float, int]] = []  # (seconds since the first send, messages received)
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        began = time.perf_counter()
        await pilot.pause(0.3)
        timer = app.set_interval(0.1, tick)
        looks = 0
        # At least one look and one press, however late a loaded machine wakes this loop (a 1 s run
        # whose first pause overran the window measured nothing: key p95 nan).
        while looks == 0 or time.perf_counter() - began < seconds:
            await pilot.pause(0.1)
            looks += 1
            progress.append((time.perf_counter() - began, store.counters().received))
            step = shown_step(app)
            sent_at = published_at(app, step) if step is not None else None
            if sent_at is not None:
                delays.append(time.time() - sent_at)
            if looks % 5 == 1:  # a key press every fifth look, the first one included
                key_ms.append(await probe.press_ms())
        timer.stop()
        sent_line = asyncio.ensure_future(asyncio.to_thread(publisher.stdout.readline))
        deadline = time.perf_counter() + 15
        while time.perf_counter() < deadline:  # the viewer drains what it is behind by
            await pilot.pause(0.05)
            counters = store.counters()
            progress.append((time.perf_counter() - began, counters.received))
            if sent_line.done() and accounted(counters) >= sum(map(int, sent_line.result().split()[:2])):
                break  # every message numbered is received or counted lost (a later beat told)
        steps = int((await sent_line).split()[2])
        publisher.stdin.write("stop\n")
        publisher.stdin.flush()
        sent, pub_dropped = map(int, (await asyncio.to_thread(publisher.stdout.readline)).split())
        publisher.wait(10)
        last_beat = time.perf_counter() + 2
        while time.perf_counter() < last_beat and accounted(store.counters()) < sent + pub_dropped:
            await pilot.pause(0.05)  # the beats sent while it drained
        received = store.counters().received
        elapsed = next((at for at, count in progress if count >= sent), progress[-1][0])
        lost = store.counters().gaps
        await pilot.pause(0.5)  # the status line is refreshed a few times a second
        shown_gaps = status_gaps(str(app.query_one("#status").visual))
        # The baseline, same run: the same key press with the same data on screen, no traffic.
        idle_ms = [await probe.press_ms() for _ in range(10)]
    malformed = store.counters().malformed
    return Result(rate, sent, steps, pub_dropped, received, lost, elapsed, key_ms, idle_ms, late_ms, delays,
                  malformed, shown_gaps)


def status_gaps(status: str) -> int | None:
    """The ``gaps N`` figure of the dashboard's status line."""
    match = re.search(r"gaps ([\d,]+)", status)
    return int(match.group(1).replace(",", "")) if match else None


def p95(values: list[float]) -> float:
    return (
        statistics.quantiles(values, n=20, method="inclusive")[-1]  # never above the largest value
        if len(values) >= 2
        else (values[0] if values else float("nan"))
    )


@dataclass(frozen=True)
class Row:
    """One rate's figures as a run of this script prints them."""

    absorbed: float
    lost: int
    key_p95_ms: float
    delay_p95_s: float


def parse_rows(output: str) -> dict[int, Row]:
    """The table of a run's output, by target rate (any version of this script prints it alike)."""
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) >= 11 and cells[0].replace(",", "").isdigit() and "/" in cells[6]:
            rows[int(cells[0].replace(",", ""))] = Row(
                absorbed=float(cells[2].replace(",", "")), lost=int(cells[5].replace(",", "")),
                key_p95_ms=float(cells[6].split("/")[1]), delay_p95_s=float(cells[-1].split("/")[1]),
            )
    return rows


def spread(values: list[float], digits: int) -> str:
    """``median [min-max]``."""
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def compare(args: argparse.Namespace, rates: list[int]) -> int:
    """This tree against ``args.against``, alternating runs, a table of medians and spreads."""
    script_args = ["--rates", ",".join(map(str, rates)), "--seconds", str(args.seconds)]
    if args.traffic != "plain":
        script_args += ["--traffic", args.traffic]
    try:
        here, there = _against.alternate(args.against, args.pairs, "ingest.py", script_args, parse_rows,
                                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    except _against.AgainstError as exc:
        print(f"ingest.py: {exc}", file=sys.stderr)
        return 2
    print(f"{args.pairs} alternating pairs, {args.seconds:g} s a rate; median [min-max] over the runs")
    header = (f"{'target/s':>9}  {'tree':<12} {'screen delay p95 s':>20} {'key p95 ms':>20} "
              f"{'absorbed/s':>10} {'lost':>8}")
    print(header)
    print("-" * len(header))
    for rate in rates:
        for name, runs in (("this tree", here), (args.against[:12], there)):
            rows = [run[rate] for run in runs if rate in run]
            if not rows:
                print(f"{rate:>9,}  {name:<12} (no figures)")
                continue
            print(f"{rate:>9,}  {name:<12} {spread([r.delay_p95_s for r in rows], 2):>20} "
                  f"{spread([r.key_p95_ms for r in rows], 1):>20} "
                  f"{statistics.median(r.absorbed for r in rows):>10,.0f} "
                  f"{statistics.median(r.lost for r in rows):>8,.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="10000,50000,100000", help="target msg/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of sending per rate")
    parser.add_argument(
        "--traffic",
        choices=("plain", "hostile"),
        default="plain",
        help="plain: valid metrics only; hostile: also, every fifth step, a message with 200 new metric "
        "names, an event with a new id, 64 GPUs reading inf/nan, a bad type, or 2,000 brackets",
    )
    parser.add_argument("--against", metavar="REV",
                        help="compare with this commit: alternating runs of both trees (see above)")
    parser.add_argument("--pairs", type=int, default=3, help="with --against: runs of each tree")
    args = parser.parse_args(argv)
    rates = [int(rate) for rate in args.rates.split(",")]
    if args.against:
        return compare(args, rates)
    print(
        f"{os.cpu_count()} CPUs (shared: numbers are provisional); x idle = key press under load / the "
        "same press right after, traffic stopped, same data on screen"
    )
    header = (
        f"{'target/s':>9} {'sent':>8} {'absorbed/s':>10} {'share':>6} {'pub drops':>9} {'lost':>7} "
        f"{'key ms p50/p95':>15} {'x idle':>6} {'timer late p95':>14} {'delay s p50/p95/max':>20}"
    )
    print(header)
    print("-" * len(header))
    verdicts = []
    for rate in rates:
        result = asyncio.run(measure(rate, args.seconds, args.traffic))
        absorbed = result.received / result.seconds
        key = statistics.median(result.key_ms) if result.key_ms else float("nan")
        base = statistics.median(result.idle_key_ms)
        delay = (
            (statistics.median(result.delays_s), p95(result.delays_s), max(result.delays_s))
            if result.delays_s
            else (float("nan"),) * 3
        )
        print(
            f"{rate:>9,} {result.sent:>8,} {absorbed:>10,.0f} {result.received / max(result.sent, 1):>6.1%} "
            f"{result.pub_dropped:>9,} {result.lost:>7,} {key:>7.1f}/{p95(result.key_ms):<7.1f} "
            f"{key / base:>6.2f} {p95(result.timer_late_ms):>11.1f} ms "
            f"{delay[0]:>6.2f}/{delay[1]:.2f}/{delay[2]:.2f}"
        )
        if result.lost or result.uncounted:
            verdicts.append(
                f"{rate:,} msg/s: {result.lost:,} lost on the way, counted as gaps; the status line showed "
                f"{'no gaps' if result.shown_gaps is None else f'gaps {result.shown_gaps:,}'}; "
                f"{result.uncounted:,} lost without being counted"
            )
        if args.traffic == "hostile":
            verdicts.append(f"{rate:,} msg/s hostile: key p95 {p95(result.key_ms):.0f} ms (target <= 100), "
                            f"malformed counted {result.malformed:,}")
        elif rate == 50_000:
            verdicts.append(
                f"50k msg/s: absorbed {absorbed:,.0f}/s (target 50,000), screen p95 delay "
                f"{delay[1]:.2f} s (target <= 0.5)"
            )
    for verdict in verdicts:
        print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
