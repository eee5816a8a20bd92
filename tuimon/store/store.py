"""Viewer state built from decoded wire messages: plain Python, no Textual, one lock.

Both sources (the live ZeroMQ receiver and the recording player) feed a :class:`Store` through the
:class:`~tuimon.sink.Sink` interface; the dashboard reads it on timers. Writers apply whole batches
under the lock and readers take small copies, so neither side waits on the other for long. Every
section of a run carries a version counter so a panel can skip its redraw when nothing it shows has
changed.

Messages must already have passed :func:`publisher.wire.protocol.decode`: the store trusts the shapes
the protocol validates and treats everything else as optional.
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from publisher.wire import stall
from publisher.wire.protocol import ProtocolError, fold_event_update, numbered_by_sender, read_number
from publisher.wire.stall import BUSY, STUCK, WAITING, Stall
from tuimon.sink import Batch, News, Notice, Sink, SourceStatus
from tuimon.store.job import JobState, JobView
from tuimon.store.layers import LayerHistory, LayerMatrix
from tuimon.store.rates import smoothed_rate
from tuimon.store.records import Counters, DeviceView, EventRecord, InvariantRecord, RunView
from tuimon.store.series import Ring, Series, share_of_points

#: A run whose senders have been silent this long is shown as stale (heartbeats come every 1 s).
STALE_AFTER_S = 3.0
#: Samples of history kept per GPU device: five minutes at the default 1 Hz sampler.
GPU_HISTORY = 300
#: Events kept per run; the oldest go first (detectors fold repeats, so this is rarely reached).
MAX_EVENTS = 10_000
#: What one store keeps at most, whatever peers send (messages beyond are counted, not kept):
#: runs, ranks and GPUs of a run, metric names of a run, relays, series in all (with the points budget
#: of :mod:`tuimon.store.series`, memory stays bounded under any input).
MAX_RUNS = 64
MAX_RANKS = 16_384
MAX_DEVICES = 8_192
MAX_METRIC_NAMES = 256
MAX_INVARIANTS = 256
MAX_RELAYS = 1_024
MAX_SERIES = 8_192
#: Distinct names remembered to count what was left out (beyond, the count says "at least").
_LEFT_OUT_MEMORY = 10_000
#: Values applied per hold of the lock (a few milliseconds of work): the UI's readers wait no longer.
_CHUNK_VALUES = 5_000
#: Preferred throughput metrics, best first.
THROUGHPUT_METRICS = ("tokens_per_s", "samples_per_s")
#: Steps the header's throughput may be smoothed over at most (:mod:`tuimon.store.rates`).
RATE_STEPS = 2_000
#: Sections of a run that have their own version counter.
SECTIONS = ("run", "metrics", "gpu", "events", "invariants", "nodes", "layers")

_RUN_END_SEVERITY = {"failed": 2, "interrupted": 1, "completed": 0}


@dataclass
class _Rank:
    rank: int
    host: str
    last_seq: int | None = None
    step: int | None = None
    step_ts: float | None = None
    last_heard: float = 0.0
    last_ts: float | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    snapshot_address: str | None = None
    gaps: int = 0
    end: Mapping[str, Any] | None = None
    #: What its watchdog last said (:data:`publisher.wire.stall.BEAT_FIELDS`, from a heartbeat or a
    #: node's summary), when it was heard, and the step it was said at (a later step clears it).
    watchdog: Mapping[str, Any] = field(default_factory=dict)
    watchdog_heard: float = 0.0
    watchdog_step: int | None = None
    #: Its series by metric name (found by the name alone, whose hash a string keeps: no (rank,
    #: name) tuple built per value of every message).
    series: dict[str, Series] = field(default_factory=dict)


@dataclass
class _Device:
    rank: int
    index: int
    latest: Mapping[str, Any]
    ts: float
    history: dict[str, Ring] = field(
        default_factory=lambda: {name: Ring(GPU_HISTORY) for name in ("util", "mem", "temp", "power")}
    )


@dataclass
class _Run:
    name: str
    ranks: dict[int, _Rank] = field(default_factory=dict)
    run_start: Mapping[str, Any] | None = None
    started_ts: float | None = None
    metric_names: list[str] = field(default_factory=list)  # in the order they first appeared
    known_names: set[str] = field(default_factory=set)  # the same, for membership tests
    devices: dict[tuple[int, int], _Device] = field(default_factory=dict)
    gpu_simulated: bool = False
    events: OrderedDict[str, EventRecord] = field(default_factory=OrderedDict)
    invariants: dict[str, InvariantRecord] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0))
    #: Metric names not kept (over :data:`MAX_METRIC_NAMES`, or no room for more series).
    names_left_out: set[str] = field(default_factory=set)
    #: The node relays' summaries of this run, and its loss band.
    job: JobState = field(default_factory=JobState)
    #: Per-layer samples, by rank.
    layers: dict[int, LayerHistory] = field(default_factory=dict)
    #: The parts of the Monitor that failed (``telemetry_error`` events), as ``rank:part``, at most
    #: :data:`MAX_EVENTS`: a part told twice (its first failure, then switched off) counts once.
    telemetry_errors: set[str] = field(default_factory=set)


#: Which stalled rank a run's header shows first: the one the others wait for.
_STALL_ORDER = {STUCK: 0, BUSY: 1, WAITING: 2}


def _stalls(ranks: Iterable[_Rank], now: float) -> dict[int, Stall]:
    """The verdict (:func:`publisher.wire.stall.judge`) on each rank that is stalled now, by its
    watchdog's last word brought up to ``now``; ranks silent for :data:`STALE_AFTER_S` (the run
    shows as stale) or ended are left out."""
    stalls = {}
    for rank in ranks:
        seconds = rank.watchdog.get("stalled_s")
        silent = now - rank.last_heard > STALE_AFTER_S
        if rank.end is not None or silent or not isinstance(seconds, int | float):
            continue
        verdict = stall.judge({**rank.watchdog, "stalled_s": seconds + max(now - rank.watchdog_heard, 0.0)})
        if verdict.stalled:
            stalls[rank.rank] = verdict
    return stalls


def _late_copy(state: _Rank, message: Mapping[str, Any]) -> bool:
    """Whether ``message`` is a relay's late copy of what its sender said before: numbered and
    stamped before the last message heard from it. A node relay that found a rank after its start
    forwards its ``run_start``, events and invariants after the rank's live messages
    (tuimon/relay/catchup.py); read as a restart, the next live message would count every number
    in between as lost. A restarted sender numbers from 0 again but stamps later."""
    if state.last_seq is None or state.last_ts is None:
        return False
    return message["seq"] <= state.last_seq and message["ts"] < state.last_ts


def _rank_series(run: _Run, rank: int, name: str) -> Series | None:
    """Rank ``rank``'s series of metric ``name`` (None: no such rank or metric)."""
    state = run.ranks.get(rank)
    return state.series.get(name) if state is not None else None


def _number(value: Any) -> float:
    """A stored value: numbers as floats, absent values as NaN (history arrays stay aligned)."""
    number = read_number(value) if not isinstance(value, bool) else None
    return math.nan if number is None else number


class Store(Sink):
    """Every run heard from, keyed by run name, plus source-wide counters: the :class:`Sink` both
    sources fill (the live receiver, the recording player).

    ``clock`` gives "now" for health (live: wall time; replay: the recording's virtual time).
    With ``stamp_with_message_ts`` a message counts as heard at its own ``ts`` (replay), otherwise
    at the moment it was applied (live).
    """

    def __init__(
        self, clock: Callable[[], float] = time.time, *, stamp_with_message_ts: bool = False
    ) -> None:
        self.clock = clock
        self._stamp_with_message_ts = stamp_with_message_ts
        self._lock = threading.Lock()
        # Every change takes the next number of this counter, which survives reset(): a version a
        # panel remembers is never handed out again for different content.
        self._changes = 0
        self.generation = 0  # how many times reset() was called: panels start over when it moves
        self._reset_state()

    def _reset_state(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._received = 0
        self._malformed: Counter[str] = Counter()
        self._last_malformed: str | None = None
        self._source = SourceStatus()
        self._notices: dict[str, tuple[str, float | None]] = {}
        self._all_series: list[Series] = []  # every series of every run: they share the points budget
        self._runs_left_out: set[str] = set()
        self._relays: dict[str, Mapping[str, Any]] = {}  # relay name -> its latest heartbeat
        changed = self._next()
        self._counters_version = self._source_version = self._notices_version = changed

    def _next(self) -> int:
        self._changes += 1
        return self._changes

    def _bump(self, run: _Run, *sections: str) -> None:
        self._changes += 1
        for section in sections:
            run.versions[section] = self._changes

    # ----------------------------------------------------------------- writers (source threads)

    def reset(self) -> None:
        """Forget everything (replay seeks backwards by rebuilding from the start)."""
        with self._lock:
            self._reset_state()
            self.generation += 1

    def deliver(self, batch: Batch) -> None:
        """Apply what a source heard, in order; count the frames received and the malformed ones.

        Live messages are applied in chunks, the lock let go between them (readers never wait
        long); a sequence gap among them is counted unless the batch is not ``complete``. A
        snapshot is applied in one hold of the lock: its messages without counting gaps (it holds
        a selection), then its sender's last ``seq`` set to the snapshot's, then the live messages
        that followed it (counting gaps among them unless the batch is not ``complete``).
        """
        snapshot = batch.snapshot
        if snapshot is None:
            for chunk in _chunks(batch.messages):
                with self._lock:
                    self._apply_each(chunk, live=batch.complete)
        else:
            with self._lock:
                self._apply_each(batch.history, live=False)
                known = self._run(snapshot.run)
                state = self._rank(known, snapshot.rank, host="") if known is not None else None
                if state is not None:
                    state.last_seq = snapshot.seq
                self._apply_each(batch.live, live=batch.complete)
        received = batch.received
        with self._lock:
            self._received += len(batch.messages) + len(batch.malformed) if received is None else received
            for error, where in batch.malformed:
                self._count_malformed(error, where)
            self._counters_version = self._next()

    def tell(self, news: News) -> None:
        """A notice for the dashboard's lines (text None clears it), or the source's status."""
        with self._lock:
            if isinstance(news, Notice):
                self._set_notice(news.key, news.text, news.ttl_s)
            elif news != self._source:
                self._source = news
                self._source_version = self._next()

    def _set_notice(self, key: str, text: str | None, ttl_s: float | None) -> None:
        old = self._notices.get(key)
        if text is None:
            if old is None:
                return
            del self._notices[key]
        else:
            expires = time.monotonic() + ttl_s if ttl_s is not None else None
            if old is not None and old[0] == text and expires is None:
                return
            self._notices[key] = (text, expires)
        self._notices_version = self._next()

    def _count_malformed(self, error: ProtocolError, where: str | None = None) -> None:
        self._malformed[error.reason] += 1
        self._last_malformed = f"{error} ({where})" if where else str(error)

    def _run(self, name: str) -> _Run | None:
        """The run's state; None for a new run beyond :data:`MAX_RUNS` (its messages are skipped)."""
        run = self._runs.get(name)
        if run is None:
            if len(self._runs) >= MAX_RUNS:
                if len(self._runs_left_out) < _LEFT_OUT_MEMORY:
                    self._runs_left_out.add(name)
                self._set_notice(
                    "runs-left-out",
                    f"{_count(self._runs_left_out)} more runs not shown: this viewer keeps {MAX_RUNS}",
                    None,
                )
                return None
            run = self._runs[name] = _Run(name)
        return run

    def _rank(self, run: _Run, rank: int, host: str) -> _Rank | None:
        """The rank's state; None for a new rank beyond :data:`MAX_RANKS` of its run."""
        state = run.ranks.get(rank)
        if state is None:
            if len(run.ranks) >= MAX_RANKS:
                return None
            state = run.ranks[rank] = _Rank(rank, host)
            self._bump(run, "run")
        return state

    def _apply_each(self, messages: Iterable[Mapping[str, Any]], *, live: bool) -> None:
        """Apply messages in order; one that breaks the store is counted as malformed, alone."""
        for message in messages:
            try:
                self._apply(message, live=live)
            except Exception as exc:  # decode() let it through: a bug here must not lose the batch
                self._count_malformed(ProtocolError(f"{message.get('type')}: {exc!r}", "viewer error"))

    def _apply(self, message: Mapping[str, Any], *, live: bool) -> None:
        """Book-keep the sender (sequence gaps, last heard), then hand the message to its type's handler."""
        msg_type = message["type"]
        if msg_type == "relay":  # a relay's own heartbeat: about the path, not a run
            if message["run"] in self._relays or len(self._relays) < MAX_RELAYS:
                self._relays[message["run"]] = message
                self._source_version = self._next()
            return
        # Known runs and ranks without a call: this runs for every message (``benchmarks/ingest.py``).
        run = self._runs.get(message["run"]) or self._run(message["run"])
        if run is not None and msg_type == "summary":  # a node's ranks in one message
            self._on_summary(run, message)
            return
        state = (run.ranks.get(message["rank"]) or self._rank(run, message["rank"], message["host"])
                 if run is not None else None)
        if run is None or state is None:
            return
        if numbered_by_sender(message):  # else a relay's finding about this rank, not the rank's own
            self._book_keep(run, state, message, live=live)
        handler = self._HANDLERS.get(msg_type)
        if handler is not None:  # a type this viewer does not know: the protocol says to ignore it
            handler(self, run, state, message)

    def _book_keep(self, run: _Run, state: _Rank, message: Mapping[str, Any], *, live: bool) -> None:
        """The sender's sequence (a jump in a live stream is a loss) and when it was last heard;
        nothing for a relay's late copy of what it said before (:func:`_late_copy`)."""
        if _late_copy(state, message):
            return
        seq = message["seq"]
        if live and state.last_seq is not None:
            missed = seq - state.last_seq - 1
            if missed > 0:
                state.gaps += missed
                self._bump(run, "run")
            # seq <= last, sent later: the sender restarted (a new process under the same run and
            # rank); counting continues from its new numbers.
        if state.last_seq is None or live or seq > state.last_seq:
            state.last_seq = seq
        state.host = message["host"]
        state.last_heard = message["ts"] if self._stamp_with_message_ts else self.clock()
        state.last_ts = message["ts"]

    def _on_summary(self, run: _Run, message: Mapping[str, Any]) -> None:
        """A node's summary; it also stands for its ranks' heartbeats (which a job viewer receives
        from its focused rank only): each rank is known, with its step and when it was last heard."""
        if message["node"] in run.job.nodes or len(run.job.nodes) < MAX_RANKS:
            run.job.add(message)
            self._bump(run, "nodes")
        heard = message["ts"] if self._stamp_with_message_ts else self.clock()
        steps, beats = message.get("steps") or [], message.get("beats") or []
        for i, number in enumerate(message["ranks"]):
            state = self._rank(run, number, message["host"])
            if state is None:
                continue
            beat = beats[i] if i < len(beats) else {}
            silent = beat.get("silent_s", 0.0)
            state.last_heard = heard - silent  # the relay heard it last this long before it wrote
            step = steps[i] if i < len(steps) else None
            if isinstance(step, int) and (state.step is None or step > state.step):
                state.step, state.step_ts = step, message["ts"]
            if "stalled_s" in beat:  # as of the summary (its node relay brought it up to date)
                self._watchdog(state, beat, heard, step if isinstance(step, int) else None)

    def _on_metrics(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        step = message["step"]
        kept = state.series
        for name, value in message["metrics"].items():
            series = kept.get(name)
            if series is None:
                series = self._new_series(run, state, name)
                if series is None:
                    continue
            series.append(step, value if value.__class__ is float else _number(value))  # floats: no call
        sample = message.get("layers")
        if isinstance(sample, dict):
            history = run.layers.get(state.rank)
            if history is None:
                history = run.layers[state.rank] = LayerHistory()
            if history.add(step, sample):
                self._bump(run, "layers")
        state.step, state.step_ts = step, message["ts"]
        if state.watchdog and (state.watchdog_step is None or step > state.watchdog_step):
            state.watchdog = {}  # steps resumed since the watchdog spoke
        self._bump(run, "metrics", "run")

    def _watchdog(self, state: _Rank, fields: Mapping[str, Any], heard: float, step: int | None) -> None:
        state.watchdog = {name: fields[name] for name in stall.BEAT_FIELDS if name in fields}
        state.watchdog_heard, state.watchdog_step = heard, step

    def _new_series(self, run: _Run, state: _Rank, name: str) -> Series | None:
        """A series for a metric seen for the first time on this rank, within the store's bounds:
        at most :data:`MAX_METRIC_NAMES` names a run, :data:`MAX_SERIES` series in all, which
        share the points budget (:func:`~tuimon.store.series.share_of_points`)."""
        known = name in run.known_names
        if (not known and len(run.metric_names) >= MAX_METRIC_NAMES) or len(self._all_series) >= MAX_SERIES:
            if name not in run.names_left_out and len(run.names_left_out) < _LEFT_OUT_MEMORY:
                run.names_left_out.add(name)
                self._bump(run, "run")
            return None
        if not known:
            run.metric_names.append(name)
            run.known_names.add(name)
        series = state.series[name] = Series(share_of_points(len(self._all_series) + 1))
        self._all_series.append(series)
        if series.capacity < self._all_series[0].capacity:
            for other in self._all_series:  # everyone's share just shrank
                other.capacity = series.capacity
        return series

    def _on_heartbeat(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        stats = message.get("stats")
        state.stats = stats if isinstance(stats, dict) else {}
        address = message.get("snapshot")
        state.snapshot_address = address if isinstance(address, str) else None
        step = message.get("step")
        if step is not None and (state.step is None or step > state.step):
            state.step, state.step_ts = step, message["ts"]
        heard = message["ts"] if self._stamp_with_message_ts else self.clock()
        self._watchdog(state, message, heard, step)
        self._bump(run, "run")

    def _on_gpu(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        ts, rank = message["ts"], state.rank
        run.gpu_simulated = bool(message.get("simulated"))
        for device in message["devices"]:
            key = (rank, device["index"])
            known = run.devices.get(key)
            if known is None:
                if len(run.devices) >= MAX_DEVICES:
                    continue
                known = run.devices[key] = _Device(rank, device["index"], device, ts)
            known.latest, known.ts = device, ts
            used, total = _number(device.get("mem_used")), _number(device.get("mem_total"))
            memory = 100.0 * used / total if total > 0 else math.nan  # NaN stays NaN through both
            history = known.history
            history["util"].append(_number(device.get("util")))
            history["mem"].append(memory)
            history["temp"].append(_number(device.get("temp_c")))
            history["power"].append(_number(device.get("power_w")))
        self._bump(run, "gpu")

    def _on_event(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        ts, rank = message["ts"], state.rank
        event_id = str(message.get("id") or f"{rank}-{message['seq']}")
        previous = run.events.get(event_id)
        count = message.get("count")
        if previous is not None and isinstance(count, int) and count < previous.count:
            return  # an older update of the episode (from a late joiner's snapshot): keep the newer
        if previous is not None:
            message = fold_event_update(previous.message, previous.details, message)
        text, details = message["message"], message.get("details")
        details = details if isinstance(details, dict) else {}
        latest = message.get("latest")
        latest = latest if isinstance(latest, dict) else {}  # validated: an object or absent
        run.events[event_id] = EventRecord(
            id=event_id,
            rank=rank,
            step=message.get("step"),
            severity=message["severity"],
            kind=message["kind"],
            message=text,
            details=details,
            count=count if isinstance(count, int) and not isinstance(count, bool) else 1,
            ts=ts,
            first_ts=previous.first_ts if previous else ts,
            latest_step=latest.get("step"),
            latest_message=latest.get("message"),
            latest_details=latest.get("details"),
        )
        if len(run.events) > MAX_EVENTS:
            run.events.popitem(last=False)
        if message["kind"] == "telemetry_error" and len(run.telemetry_errors) < MAX_EVENTS:
            part = details.get("part")
            run.telemetry_errors.add(f"{rank}:{part}" if isinstance(part, str) else event_id)
        self._bump(run, "events")

    def _on_invariant(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        name = message["name"]
        if name not in run.invariants and len(run.invariants) >= MAX_INVARIANTS:
            return
        details = message.get("details")
        run.invariants[name] = InvariantRecord(
            name=name,
            status=message["status"],
            step=message.get("step"),
            message=str(message.get("message") or ""),
            details=details if isinstance(details, dict) else {},
            rank=state.rank,
            ts=message["ts"],
        )
        self._bump(run, "invariants")

    def _on_run_start(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        if run.run_start is None or state.rank <= min(run.ranks):
            run.run_start = message
        ts = message["ts"]
        run.started_ts = ts if run.started_ts is None else min(run.started_ts, ts)
        state.end = None
        self._bump(run, "run")

    def _on_run_end(self, run: _Run, state: _Rank, message: Mapping[str, Any]) -> None:
        state.end = message
        step = message.get("step")
        if step is not None:
            state.step = step
        self._bump(run, "run")

    #: Message type -> its handler; types not listed are skipped (newer protocol, older viewer).
    _HANDLERS: ClassVar[dict[str, Callable[[Store, _Run, _Rank, Mapping[str, Any]], None]]] = {
        "metrics": _on_metrics,
        "heartbeat": _on_heartbeat,
        "gpu": _on_gpu,
        "event": _on_event,
        "invariant": _on_invariant,
        "run_start": _on_run_start,
        "run_end": _on_run_end,
    }

    # --------------------------------------------------------------------- readers (UI thread)

    def run_names(self) -> list[str]:
        """Runs in the order they were first heard."""
        with self._lock:
            return list(self._runs)

    def versions(self, run: str) -> dict[str, int]:
        """Per-section version counters of ``run`` (all zero for an unknown run)."""
        with self._lock:
            state = self._runs.get(run)
            return dict(state.versions) if state else dict.fromkeys(SECTIONS, 0)

    def job_view(self, run: str) -> JobView | None:
        """The run as node relays summarise it (None when no relay sent a summary of it)."""
        with self._lock:
            state = self._runs.get(run)
            return state.job.view(run, time.monotonic()) if state and state.job.nodes else None

    def relays(self) -> list[Mapping[str, Any]]:
        """The latest heartbeat of each relay the stream came through, by name."""
        with self._lock:
            return [self._relays[name] for name in sorted(self._relays)]

    def status_version(self) -> tuple[int, int, int]:
        """Changes when the counters, the source status or the notices change."""
        return self._counters_version, self._source_version, self._notices_version

    def now(self) -> float:
        return self.clock()

    def run_view(self, run: str) -> RunView | None:
        with self._lock:
            state = self._runs.get(run)
            return self._run_view(state) if state else None

    def _run_view(self, run: _Run) -> RunView:
        ranks = run.ranks
        stepping = [r for r in ranks.values() if r.step is not None]
        latest = max(stepping, key=lambda r: (r.step, r.step_ts or 0.0), default=None)
        throughput = None
        primary = min(ranks) if ranks else 0
        for name in THROUGHPUT_METRICS:
            series = _rank_series(run, primary, name)
            if series is not None and len(series):
                times = _rank_series(run, primary, "step_time")
                recent = times.values[-RATE_STEPS:] if times is not None else ()
                throughput = smoothed_rate(name, series.values[-RATE_STEPS:], recent)
                break
        ends = [r.end for r in ranks.values() if r.end]
        end_status = end_error = None
        stalls: dict[int, Stall] = {}
        if ranks and len(ends) == len(ranks):
            worst = max(ends, key=lambda end: _RUN_END_SEVERITY.get(end.get("status", ""), 0))
            end_status, end_error = worst.get("status"), worst.get("error")
            health = "ended"
        else:
            now = self.clock()
            silent = any(now - r.last_heard > STALE_AFTER_S for r in ranks.values() if r.end is None)
            health = "stale" if silent else "live"
            stalls = _stalls(ranks.values(), now)
        shown = min(stalls, key=lambda n: (_STALL_ORDER[stalls[n].state], -stalls[n].stalled_s), default=None)
        start = run.run_start or {}
        world_size = start.get("world_size")
        return RunView(
            name=run.name,
            hosts=tuple(sorted({r.host for r in ranks.values() if r.host})),
            ranks=tuple(sorted(ranks)),
            world_size=world_size if isinstance(world_size, int) else None,
            step=latest.step if latest else None,
            step_ts=latest.step_ts if latest else None,
            started_ts=run.started_ts,
            last_ts=max((r.last_ts for r in ranks.values() if r.last_ts is not None), default=None),
            throughput=throughput,
            gpu_source=start.get("gpu_source") if isinstance(start.get("gpu_source"), str) else None,
            gpu_simulated=run.gpu_simulated or start.get("gpu_source") == "simulated",
            health=health,
            end_status=end_status,
            end_error=end_error if isinstance(end_error, str) else None,
            run_start=run.run_start,
            gaps=sum(r.gaps for r in ranks.values()),
            dropped=sum(_int(r.stats.get("dropped")) for r in ranks.values()),
            metrics_left_out=len(run.names_left_out),
            stall=stalls[shown] if shown is not None else None,
            stall_rank=shown,
            stall_waiting=sum(verdict.state == WAITING for verdict in stalls.values()),
            telemetry_errors=len(run.telemetry_errors),
        )

    def metric_names(self, run: str) -> list[str]:
        """Metric names seen in ``run``, in the order they first appeared."""
        with self._lock:
            state = self._runs.get(run)
            return list(state.metric_names) if state else []

    def series(
        self, run: str, name: str, *, rank: int | None = None, last: int | None = None
    ) -> tuple[Sequence[int], Sequence[float]]:
        """Copies of a metric's (steps, values) as flat arrays; the lowest rank unless ``rank``."""
        with self._lock:
            found = self._series(run, name, rank)
            return found.tail(last) if found else (array("q"), array("d"))

    def layer_matrix(
        self, run: str, statistic: str, *, rank: int | None = None, last: int | None = None
    ) -> LayerMatrix | None:
        """The layer heatmap of ``statistic`` (:data:`~tuimon.store.layers.STATISTIC_KEYS`) for
        ``rank``, else the lowest rank that sent layer samples; None when none did."""
        with self._lock:
            state = self._runs.get(run)
            if state is None or not state.layers:
                return None
            history = state.layers.get(rank if rank is not None else min(state.layers))
            return history.matrix(statistic, last) if history is not None else None

    def metric_window(
        self,
        run: str,
        step: int,
        *,
        before: int = 50,
        after: int = 50,
        names: Iterable[str] | None = None,
        rank: int | None = None,
    ) -> dict[str, tuple[list[int], list[float]]]:
        """Every metric (or ``names``) between ``step - before`` and ``step + after``: the context
        around an event, for the event detail view and the incident knowledge base."""
        with self._lock:
            state = self._runs.get(run)
            if state is None:
                return {}
            wanted = list(names) if names is not None else list(state.metric_names)
            window = {}
            for name in wanted:
                found = self._series(run, name, rank)
                if found is not None:
                    window[name] = found.between(step - before, step + after)
            return window

    def _series(self, run: str, name: str, rank: int | None) -> Series | None:
        state = self._runs.get(run)
        if state is None or not state.ranks:
            return None
        return _rank_series(state, min(state.ranks) if rank is None else rank, name)

    def devices(self, run: str) -> list[DeviceView]:
        """GPU devices of every rank, ordered by (rank, index)."""
        with self._lock:
            state = self._runs.get(run)
            if state is None:
                return []
            return [_device_view(device) for _, device in sorted(state.devices.items())]

    def events(self, run: str) -> list[EventRecord]:
        """Events in the order their episodes began (records are immutable: no copy needed)."""
        with self._lock:
            state = self._runs.get(run)
            return list(state.events.values()) if state else []

    def event(self, run: str, event_id: str) -> EventRecord | None:
        with self._lock:
            state = self._runs.get(run)
            return state.events.get(event_id) if state else None

    def invariants(self, run: str) -> list[InvariantRecord]:
        with self._lock:
            state = self._runs.get(run)
            return list(state.invariants.values()) if state else []

    def counters(self) -> Counters:
        with self._lock:
            runs = self._runs.values()
            return Counters(
                received=self._received,
                malformed=sum(self._malformed.values()),
                malformed_by_reason=dict(self._malformed),
                last_malformed=self._last_malformed,
                gaps=sum(r.gaps for run in runs for r in run.ranks.values()),
                dropped=sum(_int(r.stats.get("dropped")) for run in runs for r in run.ranks.values()),
            )

    def source_status(self) -> SourceStatus:
        return self._source

    def notices(self) -> list[str]:
        """Current notices, oldest first; expired ones are dropped here."""
        with self._lock:
            now = time.monotonic()
            expired = [key for key, (_, until) in self._notices.items() if until is not None and until < now]
            for key in expired:
                del self._notices[key]
            if expired:
                self._notices_version = self._next()
            return [text for text, _ in self._notices.values()]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _chunks(messages: Iterable[Mapping[str, Any]]) -> Iterator[list[Mapping[str, Any]]]:
    """Messages in chunks of about :data:`_CHUNK_VALUES` values each (a metrics message with 500
    names is as much work as 500 with one), so that applying a batch holds the lock briefly."""
    chunk: list[Mapping[str, Any]] = []
    work = 0
    for message in messages:
        chunk.append(message)
        body = message.get("metrics") or message.get("devices") or ()
        work += 1 + len(body)
        if work >= _CHUNK_VALUES:
            yield chunk
            chunk, work = [], 0
    if chunk:
        yield chunk


def _device_view(device: _Device) -> DeviceView:
    history = {name: ring.tolist() for name, ring in device.history.items()}
    return DeviceView(device.rank, device.index, dict(device.latest), history, device.ts)


def _count(names: set[str]) -> str:
    """How many names were left out, as far as they were remembered."""
    return f"{len(names):,}+" if len(names) >= _LEFT_OUT_MEMORY else f"{len(names):,}"
