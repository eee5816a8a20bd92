"""`tuimon metrics-server` as Prometheus sees it: a real subprocess subscribed to a real publisher
over 127.0.0.1, scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
import zmq
from helpers.cli import TUIMON
from helpers.peers import RawPublisher
from helpers.ports import free_port
from helpers.runs import HOST
from helpers.waiting import wait_until
from prometheus_client.parser import text_string_to_metric_families

from publisher.wire.transport import Publisher

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample served, by name and labels (sorted), or {} while nothing answers yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape_until(port: int, ready: Callable[[Samples], object], what: str,
                 tick: Callable[[], None] | None = None) -> Samples:
    """The first scrape for which ``ready`` holds (``tick`` between scrapes)."""
    seen: list[Samples] = []

    def scraped() -> bool:
        seen.append(scrape(port))
        return bool(ready(seen[-1]))

    wait_until(scraped, timeout_s=30, what=what, tick=tick)
    return seen[-1]


@pytest.fixture
def server() -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    port, started = free_port(), []
    yield port, started
    for process in started:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_a_scrape_shows_each_ranks_latest_figures_gpus_and_events_counted_once_an_episode(
    server: tuple[int, list[subprocess.Popen[bytes]]],
) -> None:
    port, started = server
    publisher = Publisher("scraped", rank=3, host="node7", heartbeat_s=0.2)
    try:
        publisher.publish("run_start", config={}, world_size=4, gpu_source="none")
        for step in range(20):  # before the exporter exists: only the snapshot has these
            publisher.publish("metrics", step=step, metrics={"loss": 2.0 - step / 20, "lr": 3e-4})
        event = {"kind": "loss_spike", "severity": "warning", "message": "spike", "details": {}}
        publisher.publish("event", step=19, id="e1", count=1, **event)
        started.append(subprocess.Popen([*TUIMON, "metrics-server", publisher.endpoint, "--port", str(port)]))
        rank = {"run": "scraped", "rank": "3", "host": "node7"}
        scrape_until(port, lambda samples: value(samples, "tuimon_step", **rank) == 19, "the snapshot's end")
        publisher.publish("event", step=21, id="e1", count=2, **event)  # the same episode, repeated
        nan = {**event, "severity": "critical", "kind": "nan_loss"}
        publisher.publish("event", step=21, id="e2", count=1, **nan)
        hang = {**event, "kind": "hang", "message": "stuck"}
        publisher.publish("event", step=21, id="e3", count=1, **hang)
        publisher.publish("event", step=21, id="e3", count=2, **{**hang, "severity": "critical"})  # it lasts
        gpu = {"index": 1, "name": "GPU", "util": 97.0, "mem_used": 60 * 2**30, "mem_total": 80 * 2**30,
               "temp_c": 71.0, "power_w": 612.5}
        publisher.publish("gpu", step=21, simulated=True, devices=[gpu])
        last = {"loss": "nan", "step_time": 0.25, "tokens_per_s": 8192.0}
        publisher.publish("metrics", step=21, metrics=last)
        samples = scrape_until(port, lambda samples: value(samples, "tuimon_step", **rank) == 21, "step 21")
        critical = {"run": "scraped", "kind": "nan_loss", "severity": "critical"}
        escalated = {"run": "scraped", "kind": "hang", "severity": "critical"}
        counted = scrape_until(port, lambda samples: value(samples, "tuimon_events_total", **escalated) == 1,
                               "the last episode, escalated")
    finally:
        publisher.close()

    assert value(samples, "tuimon_loss", **rank) != value(samples, "tuimon_loss", **rank)  # NaN as sent
    assert value(samples, "tuimon_learning_rate", **rank) == pytest.approx(3e-4)  # step 19's: the latest
    assert value(samples, "tuimon_step_time_seconds", **rank) == 0.25
    assert value(samples, "tuimon_tokens_per_second", **rank) == 8192.0
    assert value(samples, "tuimon_gpu_utilization_percent", **rank, gpu="1") == 97.0
    assert value(samples, "tuimon_gpu_memory_used_bytes", **rank, gpu="1") == 60 * 2**30
    assert value(samples, "tuimon_gpu_temperature_celsius", **rank, gpu="1") == 71.0
    spikes = {"run": "scraped", "kind": "loss_spike", "severity": "warning"}
    assert value(counted, "tuimon_events_total", **spikes) == 1  # e1 twice: one episode
    assert value(counted, "tuimon_events_total", **critical) == 1
    hangs = {"run": "scraped", "kind": "hang"}
    assert value(counted, "tuimon_events_total", **hangs, severity="warning") == 1
    assert value(counted, "tuimon_events_total", **hangs, severity="critical") == 1, "escalated: heard again"


def test_malformed_frames_are_counted_by_reason_and_the_rest_still_served(
    server: tuple[int, list[subprocess.Popen[bytes]]], context: zmq.Context
) -> None:
    port, started = server
    raw = RawPublisher(context, run="raw")
    try:
        raw.send(raw.builder.run_start())
        started.append(subprocess.Popen([*TUIMON, "metrics-server", raw.endpoint, "--port", str(port)]))
        steps = iter(range(10**6))

        def feed() -> None:
            step = next(steps)
            raw.pub.send(b"{not json")
            raw.metrics(step, loss=0.5)
            raw.heartbeat(step)
            if (identity := raw.poll_request()) is not None:
                raw.reply(identity, *raw.snapshot_frames())
            time.sleep(0.02)

        rank = {"run": "raw", "rank": "0", "host": HOST}
        samples = scrape_until(
            port,
            lambda samples: value(samples, "tuimon_loss", **rank)
            and value(samples, "tuimon_malformed_messages_total", reason="not JSON"),
            "a loss and the malformed frames counted",
            tick=feed,
        )
    finally:
        raw.close()
    assert value(samples, "tuimon_loss", **rank) == 0.5


def test_a_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*TUIMON, "metrics-server", "5555", "--port", str(port)],
                              capture_output=True, timeout=60, check=False)
    assert done.returncode != 0
    assert done.stderr.decode().strip() == (
        f"tuimon: error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )


def test_through_a_relay_each_rank_is_served_from_its_nodes_summary() -> None:
    """What a root relay sends about a node (its real summarizer's message, decoded as a viewer
    decodes it) gives every rank of the node its step, loss, step time and GPUs."""
    from publisher.wire.protocol import decode, encode, make_message
    from tuimon.export.prometheus import FiguresCollector, LatestFigures
    from tuimon.relay.summary import NodeSummarizer
    from tuimon.sink import Batch

    summarizer = NodeSummarizer("nodeB")
    for rank in (4, 5):
        sender = {"run": "job", "rank": rank, "host": "nodeB", "ts": 1.0, "seq": 0, "step": 40 + rank}
        metrics = {"loss": 1.0 + rank, "step_time": 0.1 * rank}
        summarizer.observe(make_message("metrics", metrics=metrics, **sender), 1.0)
        device = {"index": 0, "name": "GPU", "util": 50.0 + rank, "mem_used": 1, "mem_total": 2}
        summarizer.observe(make_message("gpu", devices=[device], **{**sender, "seq": 1}), 1.0)
    [(run, lowest, body)] = summarizer.summaries(1.2)
    made = make_message("summary", run=run, rank=lowest, host="nodeB", ts=1.2, seq=0, **body)
    summary = decode(encode(made))
    figures = LatestFigures()
    figures.deliver(Batch([summary], complete=False))
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in FiguresCollector(figures).collect()
        for sample in family.samples
    }
    for rank in (4, 5):
        labels = {"run": "job", "rank": str(rank), "host": "nodeB"}
        assert value(samples, "tuimon_step", **labels) == 40 + rank
        assert value(samples, "tuimon_loss", **labels) == 1.0 + rank
        assert value(samples, "tuimon_step_time_seconds", **labels) == pytest.approx(0.1 * rank)
        assert value(samples, "tuimon_gpu_utilization_percent", **labels, gpu="0") == 50.0 + rank
