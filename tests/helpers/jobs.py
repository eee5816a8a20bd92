"""A job of many nodes as the root relay's viewer hears it: node summaries, relay beats and findings."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from helpers.runs import T0, decoded
from publisher.wire.protocol import make_message, wire_numbers
from tuimon.sink import Batch
from tuimon.store import Store

JOB_RUN = "llama"
ROOT_RELAY = "root@login1"


def _rank_figures(rank: int, step: int, node: int, steps: int) -> tuple[dict[str, float], dict[str, Any]]:
    """One rank's metrics and GPU reading at ``step``, with the job's scripted problems: rank 517
    straggles (slow steps, long data waits, idle GPU), rank 3001 hangs half way, node 200 runs hot,
    node 300's ranks drift to a higher loss."""
    loss = 3.0 / (1 + step / 8) * (1 + ((rank * 13) % 17 - 8) * 0.01) + (0.4 if node == 300 else 0.0)
    step_time, data_time = 0.25 + (rank % 5) * 0.002, 0.01 + (rank % 3) * 0.001
    compute_time = 0.2 + (rank % 4) * 0.001
    util = 92.0 + (rank * 37) % 7
    if rank == 517:
        step_time, data_time, util = 0.42, 0.17, 35.0
    if rank == 3001 and step > steps // 2:
        util = 0.0
    gpu = {
        "index": rank % 8,
        "name": "H100",
        "util": util,
        "mem_used": (40 + rank % 30) * 1024**3,
        "mem_total": 80 * 1024**3,
        "temp_c": 86.0 if node == 200 else 55.0 + rank % 9,
        "power_w": 500.0,
        "sm_clock_mhz": 1980,
    }
    return {"loss": loss, "step_time": step_time, "data_time": data_time, "compute_time": compute_time}, gpu


def job_batches(
    nodes: int = 512, gpus_per_node: int = 8, steps: int = 24, *, t0: float = T0
) -> list[list[dict[str, Any]]]:
    """A job of ``nodes`` nodes of ``gpus_per_node`` ranks (one GPU each) as a viewer at the root
    relay receives it: one batch per half second of node summaries (made by the real
    :class:`~tuimon.relay.summary.NodeSummarizer` from each rank's metrics and GPU readings), then
    a last batch with every relay's beat and the root's findings: rank 517 a straggler, rank 3001
    hung, rank 4095 lost (when the job is that big), and rank 12 a straggler that is over.

    The last message's time is :func:`job_end_ts`; a store whose clock reads a second later shows
    the findings as current."""
    from tuimon.relay.summary import NodeSummarizer

    names = [f"node{n:03d}" for n in range(nodes)]
    summarizers = [NodeSummarizer(name) for name in names]
    batches = []
    for step in range(steps):
        ts, now = t0 + step * 0.5, step * 0.5
        batch = []
        for node, (name, summarizer) in enumerate(zip(names, summarizers, strict=True)):
            for rank in range(node * gpus_per_node, (node + 1) * gpus_per_node):
                if rank == 4095 and step >= steps - 6:
                    continue  # lost: nothing new from it
                shown = min(step, steps // 2) if rank == 3001 else step
                metrics, gpu = _rank_figures(rank, shown, node, steps)
                sender = {"run": JOB_RUN, "rank": rank, "host": name, "ts": ts, "step": shown}
                numbers = wire_numbers(metrics)
                summarizer.observe(make_message("metrics", seq=2 * step, metrics=numbers, **sender), now)
                summarizer.observe(make_message("gpu", seq=2 * step + 1, devices=[gpu], **sender), now)
            for run, rank, body in summarizer.summaries(now):
                summary = make_message("summary", run=run, rank=rank, host=name, ts=ts, seq=step, **body)
                batch.append(decoded(summary))
        batches.append(batch)
    end = job_end_ts(steps, t0)
    relays = [(f"node@{name}", name, "node", "tcp://login1:7001") for name in names]
    relays.append((ROOT_RELAY, "login1", "root", None))
    stats = {"in": 0, "in_bytes": 0, "out": 0, "out_bytes": 0}
    beats = [
        decoded(make_message("relay", run=relay, rank=0, host=host, ts=end, seq=steps, role=role,
                             listen="tcp://127.0.0.1:7000", upstream=upstream, publishers=gpus_per_node,
                             ranks=[], stats=stats))
        for relay, host, role, upstream in relays
    ]
    findings = [
        (12, "straggler", "warning", end - 60, 2, "rank 12 on node001 is a straggler: steps take 330 ms"),
        (517, "straggler", "warning", end, 3,
         "rank 517 on node064 is a straggler: waits 160 ms more per step for data than the fastest"),
        (3001, "hang", "critical", end, 2,
         "rank 3001 on node375 stuck at step 12 for 6 s while other ranks advance (heartbeats continue)"),
        (4095, "rank_lost", "critical", end, 1,
         "rank 4095 on node511 silent for 5 s (last step 17): its process or node may be gone"),
    ]
    events = [
        job_event(rank, kind, severity, ts, count, text, number)
        for number, (rank, kind, severity, ts, count, text) in enumerate(findings)
        if rank < nodes * gpus_per_node
    ]
    return [*batches, beats + events]


@functools.cache
def big_job() -> tuple[tuple[dict[str, Any], ...], ...]:
    """:func:`job_batches` of 512 nodes of 8 GPUs, made once per session (a few seconds): tests
    share the messages and never change them (the store does not either)."""
    return tuple(tuple(batch) for batch in job_batches())


def job_store(batches: Iterable[Sequence[dict[str, Any]]], steps: int = 24) -> Store:
    """A store fed ``batches`` as a viewer at the root would be, its clock a second after the job's
    last message. The loss band takes a point each time the job view is read, at most every
    ``tuimon.store.job.BAND_PERIOD_S`` (patch it to 0 for one point a batch, as tests do)."""
    end = job_end_ts(steps)
    store = Store(clock=lambda: end + 1)
    for batch in batches:
        store.deliver(Batch(batch))
        store.job_view(JOB_RUN)
    return store


def job_end_ts(steps: int = 24, t0: float = T0) -> float:
    return t0 + (steps - 1) * 0.5


def job_event(rank: int, kind: str, severity: str, ts: float, count: int, text: str, number: int,
              gpus_per_node: int = 8) -> dict[str, Any]:
    """A finding of the root relay about ``rank`` (docs/protocol.md: ``by`` names the relay)."""
    host = f"node{rank // gpus_per_node:03d}"
    return decoded(make_message(
        "event", run=JOB_RUN, rank=rank, host=host, ts=ts, seq=1000 + number, step=12,
        id=f"{ROOT_RELAY}/{number}", kind=kind, severity=severity, message=text,
        details={"rank": rank, "host": host}, count=count, by=ROOT_RELAY,
    ))
