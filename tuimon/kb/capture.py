"""Evidence captured when an incident is opened from an event, in a form that outlives the run.

Input is what the viewer already holds, in wire-protocol shapes (``docs/protocol.md``): the event
messages, the run's ``run_start``, metric series or ``metrics`` messages, ``gpu`` device entries.
Output is plain JSON kept in the knowledge base: a window of metrics around the event, the GPU
state, the reproduction record. A recording file gives the same evidence after the fact
(``tuimon incidents new --recording FILE --event ID``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from publisher.wire.protocol import SEVERITIES, ProtocolError, fold_event_update, read_number, wire_number
from publisher.wire.recorder import read_recording
from tuimon.errors import UserError
from tuimon.sources.recording_files import resolve_recordings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: Steps kept on each side of the event(s).
DEFAULT_WINDOW = 50
#: Metrics shown first in exports; any other metric recorded in the window is kept too.
STANDARD_METRICS = (
    "loss",
    "grad_norm",
    "lr",
    "samples_per_s",
    "tokens_per_s",
    "step_time",
    "data_time",
    "host_mem_bytes",
)
#: Envelope fields that say nothing about the run itself.
_ENVELOPE_ONLY = ("v", "type", "seq")


#: A metrics window as the viewer's store gives it (``Store.metric_window``): name -> (steps, values).
MetricSeries = Mapping[str, tuple[Sequence[int], Sequence[Any]]]


class DeviceRecord(Protocol):
    """The viewer's view of a GPU (``tuimon.store.records.DeviceView``): what capture reads of it."""

    @property
    def rank(self) -> int: ...

    @property
    def latest(self) -> Mapping[str, Any]: ...


#: An event: a protocol ``event`` message, or the viewer's event record (a dataclass instance,
#: ``tuimon.store.records.EventRecord``).
EventLike: TypeAlias = "Mapping[str, Any] | DataclassInstance"
#: A GPU: a protocol ``gpu`` device entry with ``rank``/``host``, or the viewer's device view.
DeviceLike: TypeAlias = "Mapping[str, Any] | DeviceRecord"


def as_event(event: EventLike, *, run: str | None = None, host: str | None = None) -> dict[str, Any]:
    """A protocol event as a dict; accepts the viewer's event records (dataclasses) too.

    The viewer's records do not repeat the run and host of their sender: ``run``/``host`` fill in.
    """
    if isinstance(event, Mapping):
        found = dict(event)
    else:
        found = dataclasses.asdict(event)
        step, message = found.pop("latest_step", None), found.pop("latest_message", None)
        details = found.pop("latest_details", None)
        if message is not None:  # the record's repeat as the protocol sends it
            found["latest"] = {"step": step, "message": message, **({"details": details} if details else {})}
    for key, value in (("run", run), ("host", host)):
        if value is not None and not found.get(key):
            found[key] = value
    return found


def as_device(device: DeviceLike) -> dict[str, Any]:
    """A GPU device entry (protocol ``gpu`` device with ``rank``/``host``), or the viewer's device
    view (its ``latest`` sample and ``rank``)."""
    if isinstance(device, Mapping):
        return dict(device)
    return {**device.latest, "rank": device.rank}


def event_steps(events: Sequence[Mapping[str, Any]]) -> tuple[int | None, int | None]:
    steps = [e["step"] for e in events if isinstance(e.get("step"), int)]
    return (min(steps), max(steps)) if steps else (None, None)


def metrics_window(
    series: MetricSeries,
    *,
    first_step: int,
    last_step: int,
    rank: int | None = None,
    window: int = DEFAULT_WINDOW,
) -> dict[str, Any] | None:
    """Metric values from ``first_step - window`` to ``last_step + window``, one column per metric.

    Non-finite values keep their protocol spelling (``"nan"``), so a NaN loss stays visible.
    Returns None when no point falls in the window.
    """
    lo, hi = first_step - window, last_step + window
    by_name: dict[str, dict[int, Any]] = {}
    for name, (steps, values) in series.items():
        kept = {
            int(step): wire_number(read_number(value))
            for step, value in zip(steps, values, strict=True)
            if lo <= step <= hi
        }
        if kept:
            by_name[name] = kept
    if not by_name:
        return None
    steps = sorted({step for kept in by_name.values() for step in kept})
    return {
        "rank": rank,
        "first_step": lo,
        "last_step": hi,
        "event_steps": [first_step, last_step],
        "steps": steps,
        "series": {name: [kept.get(step) for step in steps] for name, kept in sorted(by_name.items())},
    }


def metrics_from_messages(messages: Iterable[Mapping[str, Any]]) -> dict[str, tuple[list[int], list[Any]]]:
    """Series per metric name from ``metrics`` messages, in the store's shape (steps, values)."""
    series: dict[str, tuple[list[int], list[Any]]] = {}
    for message in messages:
        if message.get("type") != "metrics":
            continue
        for name, value in message.get("metrics", {}).items():
            steps, values = series.setdefault(name, ([], []))
            steps.append(message["step"])
            values.append(value)
    return series


def gpu_state(devices: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The latest state of each GPU: device entries of ``gpu`` messages, with ``rank``/``host`` if known."""
    latest: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for device in devices:
        latest[(device.get("host"), device.get("rank"), device.get("index"))] = dict(device)
    if not latest:
        return None
    ordered = sorted(latest.items(), key=lambda item: tuple(str(part) for part in item[0]))
    return {"devices": [device for _, device in ordered]}


def gpu_devices_from_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Device entries of ``gpu`` messages, each labelled with its sender's rank and host."""
    return [
        {**device, "rank": message.get("rank"), "host": message.get("host")}
        for message in messages
        if message.get("type") == "gpu"
        for device in message.get("devices", [])
    ]


def reproduction(run_start: Mapping[str, Any]) -> dict[str, Any]:
    """The reproduction record: the whole ``run_start`` body (config, seed, versions, argv ...).

    ``git_commit`` and ``config_hash`` are lifted to the top from the publisher's reproduction
    record (``repro``) when it has them: they are the first thing to compare between two runs.
    """
    record = {key: value for key, value in run_start.items() if key not in _ENVELOPE_ONLY}
    extra = run_start.get("repro")
    if isinstance(extra, Mapping):
        git = extra.get("git")
        if isinstance(git, Mapping):
            record.setdefault("git_commit", git.get("commit"))
            record.setdefault("git_dirty", git.get("dirty"))
        if extra.get("config_hash") is not None:
            record.setdefault("config_hash", extra["config_hash"])
        if run_start.get("seed") is None and extra.get("seed") is not None:
            record["seed"] = extra["seed"]
    return record


def capture(
    events: Sequence[Mapping[str, Any]],
    *,
    run_start: Mapping[str, Any] | None = None,
    metrics: MetricSeries | None = None,
    gpu_devices: Iterable[DeviceLike] = (),
    window: int = DEFAULT_WINDOW,
) -> dict[str, dict[str, Any]]:
    """Context for an incident about ``events``: kind ("metrics", "gpu", "reproduction") -> data."""
    captured: dict[str, dict[str, Any]] = {}
    first, last = event_steps(events)
    if metrics is not None and first is not None and last is not None:
        ranks = {e.get("rank") for e in events}
        window_data = metrics_window(
            metrics,
            first_step=first,
            last_step=last,
            rank=ranks.pop() if len(ranks) == 1 else None,
            window=window,
        )
        if window_data is not None:
            captured["metrics"] = window_data
    state = gpu_state(as_device(device) for device in gpu_devices)
    if state is not None:
        captured["gpu"] = state
    if run_start is not None:
        captured["reproduction"] = reproduction(run_start)
    return captured


def title_for(events: Sequence[Mapping[str, Any]]) -> str:
    """A default title, short enough for a list, a search hit and a file name: the first event's
    kind, step and run (``nonfinite_loss at step 843, run lm-7``); its message is in the timeline."""
    first = events[0]
    step, run = first.get("step"), first.get("run")
    where = f" at step {step}" if isinstance(step, int) else ""
    return f"{first.get('kind', 'event')}{where}" + (f", run {run}" if run else "")


def severity_for(events: Sequence[Mapping[str, Any]]) -> str:
    """The most severe of the events' severities (``warning`` when none says)."""
    found: list[str] = [e["severity"] for e in events if e.get("severity") in SEVERITIES]
    return max(found, key=SEVERITIES.index) if found else "warning"


# -- recordings ------------------------------------------------------------------------------


def _read_recordings(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Valid messages of JSON Lines recordings, file after file (an episode's updates are in its
    rank's file, in order); malformed lines are skipped (as the viewer does)."""
    for path in paths:
        try:
            for _, _, message in read_recording(path):
                if not isinstance(message, ProtocolError):
                    yield message
        except OSError as exc:
            raise UserError(f"cannot read the recording {path}: {exc.strerror}") from None


def from_recording(
    target: str | Path, event_id: str, *, window: int = DEFAULT_WINDOW
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The event ``event_id`` of a recording (a file, a ``--record`` prefix, a folder: its latest
    update, with what set it off) and the context around it."""
    paths = resolve_recordings([target])
    event: dict[str, Any] | None = None
    run_starts: dict[tuple[str, int], dict[str, Any]] = {}
    seen_ids: list[str] = []
    for message in _read_recordings(paths):
        if message["type"] == "event":
            seen_ids.append(str(message.get("id")))
            if str(message.get("id")) == event_id:
                event = dict(message if event is None
                             else fold_event_update(event["message"], event["details"], message))
        elif message["type"] == "run_start":
            run_starts[(message["run"], message["rank"])] = message
    if event is None:
        hint = (
            f" (ids in it: {', '.join(dict.fromkeys(seen_ids[:10]))})"
            if seen_ids
            else " (it holds no events)"
        )
        raise UserError(f"no event {event_id!r} in {target}{hint}")
    run, rank = event["run"], event["rank"]
    first, last = event_steps([event])
    lo, hi = (first or 0) - window, (last or 0) + window
    in_window: list[dict[str, Any]] = []
    gpu_before: list[dict[str, Any]] = []
    for message in _read_recordings(paths):
        if message["run"] != run:
            continue
        if message["type"] == "metrics" and message["rank"] == rank and lo <= message["step"] <= hi:
            in_window.append(message)
        elif message["type"] == "gpu" and message["ts"] <= event["ts"]:
            gpu_before.append(message)
    captured = capture(
        [event],
        run_start=run_starts.get((run, rank)) or run_starts.get((run, 0)),
        metrics=metrics_from_messages(in_window) if first is not None else None,
        gpu_devices=gpu_devices_from_messages(gpu_before),
        window=window,
    )
    return event, captured
