"""The viewer's store: what the panels will show after a given sequence of messages."""

from __future__ import annotations

import math
import time

from helpers.runs import RunBuilder, synthetic_run

from publisher.wire.protocol import ProtocolError
from tuimon.sink import Batch, Notice, Snapshot
from tuimon.store import GPU_HISTORY, SERIES_CAPACITY, STALE_AFTER_S, Series, Store


class Clock:
    """A time source the test moves by hand (the store's clock is a parameter for replays too)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_event_update_replaces_the_episode_in_place_and_keeps_what_set_it_off() -> None:
    store = Store()
    run = RunBuilder("r")
    store.deliver(Batch([
        run.run_start(),
        run.event(843, "0-1", "nonfinite_loss", "warning", "loss is inf at step 843", count=1, value="inf"),
        run.event(12, "0-2", "gpu_throttle", "warning", "hot"),
    ]))
    first_seen = store.events("r")[0].first_ts
    run.ts += 5
    update = run.event(843, "0-1", "nonfinite_loss", "critical", "loss is inf at step 843", count=3,
                       value="inf")
    update["latest"] = {"step": 1500, "message": "loss is nan at step 1500", "value": "nan"}
    store.deliver(Batch([update]))

    events = store.events("r")
    assert [e.id for e in events] == ["0-1", "0-2"]  # the episode keeps its place
    spike = events[0]
    assert (spike.count, spike.severity, spike.step) == (3, "critical", 843)
    assert spike.message == "loss is inf at step 843"
    assert spike.details["value"] == "inf"
    assert spike.update_text() == "×3, latest at step 1,500: loss is nan at step 1500"
    assert spike.first_ts == first_seen and spike.ts == first_seen + 5
    assert events[1].update_text() == "", "an episode that did not repeat has no update"


def test_an_older_publishers_update_shows_as_an_update_of_what_was_heard_first() -> None:
    """Recordings made before the ``latest`` field sent the latest repeat's message and details in
    each update: replayed, what set the episode off still leads."""
    store = Store()
    run = RunBuilder("r")
    store.deliver(Batch([
        run.run_start(),
        run.event(402, "0-1", "loss_spike", "warning", "loss 2.27 at step 402, 14.6x", value=2.27,
                  last_step=402),
        run.event(402, "0-1", "loss_spike", "warning", "loss 1.28 at step 601, 8.3x", count=200, value=1.28,
                  last_step=601),
    ]))
    [spike] = store.events("r")
    assert (spike.message, spike.details["value"]) == ("loss 2.27 at step 402, 14.6x", 2.27)
    assert spike.update_text() == "×200, latest at step 601: loss 1.28 at step 601, 8.3x"


def test_the_headers_throughput_is_the_rate_over_the_last_ten_seconds_not_one_steps() -> None:
    """Two slow 64 ms steps among 24 ms ones (2,650 samples/s; the slow ones 1,000): the figure
    stays near 2,650, and it is the work done over the seconds taken, not an average of rates."""
    store = Store()
    run = RunBuilder("r")
    messages = [run.run_start()]
    for step in range(1, 1001):
        slow = step in (998, 999)
        step_time = 0.064 if slow else 0.024
        messages.append(run.metrics(step, loss=1.0, step_time=step_time, samples_per_s=64 / step_time))
    store.deliver(Batch(messages))
    rate = store.run_view("r").throughput
    assert rate is not None and rate.span() == "10 s"
    steps_in_window = rate.steps
    assert 400 <= steps_in_window <= 420, "10 s of 24 ms steps"
    expected = 64 * steps_in_window / (0.024 * (steps_in_window - 2) + 2 * 0.064)
    assert abs(rate.value - expected) < 1 and 2_600 < rate.value < 2_670


def test_gaps_are_counted_per_sender_and_a_restart_is_not_a_gap() -> None:
    store = Store()
    rank0, rank1 = RunBuilder("r", 0), RunBuilder("r", 1)
    batch = [rank0.metrics(0, loss=1.0), rank0.metrics(1, loss=1.0)]
    rank0.seq += 3  # three messages of rank 0 lost on the way
    batch += [rank0.metrics(2, loss=1.0), rank1.metrics(0, loss=1.0), rank1.metrics(1, loss=1.0)]
    store.deliver(Batch(batch))
    assert store.counters().gaps == 3
    assert store.run_view("r").gaps == 3

    restarted = RunBuilder("r", 1, t0=rank1.ts + 5)  # same run and rank, new process: seq from 0
    store.deliver(Batch([restarted.run_start(), restarted.metrics(0, loss=2.0)]))
    assert store.counters().gaps == 3


def test_a_relays_late_copies_of_a_senders_start_are_applied_without_counting_gaps() -> None:
    """A node relay that found a rank late forwards its run_start and events after the rank's
    live messages (old seq, old ts): applied, and the next live message is no jump from them."""
    store = Store()
    rank = RunBuilder("r", 3)
    start = rank.run_start()
    early = rank.event(3, "3-early", "loss_spike", "warning", "before the relay")
    live = []
    for step in range(1, 40):
        rank.ts += 0.05
        live.append(rank.metrics(step, loss=1.0 / step))
    store.deliver(Batch(live[:20]))
    store.deliver(Batch([start, early, *live[20:]]))
    assert store.counters().gaps == 0
    assert [e.id for e in store.events("r")] == ["3-early"]
    assert store.run_view("r").run_start["config"] == {"lr": 0.01, "batch_size": 32}
    rank.seq += 2  # two messages lost after all: still counted
    store.deliver(Batch([rank.metrics(40, loss=0.1)]))
    assert store.counters().gaps == 2


def test_health_goes_stale_without_heartbeats_and_ended_after_run_end() -> None:
    clock = Clock()
    store = Store(clock)
    run = RunBuilder("r")
    store.deliver(Batch([run.run_start(), run.heartbeat(0)]))
    assert store.run_view("r").health == "live"
    clock.now += STALE_AFTER_S - 0.5
    assert store.run_view("r").health == "live"
    clock.now += 1.0
    assert store.run_view("r").health == "stale"
    store.deliver(Batch([run.heartbeat(1)]))
    assert store.run_view("r").health == "live"
    store.deliver(Batch([run.message("run_end", step=1, status="failed", error="CUDA error")]))
    clock.now += 60
    view = store.run_view("r")
    assert (view.health, view.end_status, view.end_error) == ("ended", "failed", "CUDA error")


def test_a_run_with_two_ranks_ends_when_both_ended() -> None:
    store = Store()
    rank0, rank1 = RunBuilder("r", 0), RunBuilder("r", 1)
    store.deliver(Batch(
        [rank0.run_start(), rank1.run_start(), rank0.message("run_end", step=3, status="completed")]
    ))
    assert store.run_view("r").health == "live"
    store.deliver(Batch([rank1.message("run_end", step=3, status="interrupted")]))
    view = store.run_view("r")
    assert (view.health, view.end_status, view.ranks) == ("ended", "interrupted", (0, 1))


def test_replay_stamps_use_message_time() -> None:
    clock = Clock(now=0.0)
    store = Store(clock, stamp_with_message_ts=True)
    run = RunBuilder("r", t0=500.0)
    store.deliver(Batch([run.run_start()]))
    clock.now = 500.0 + STALE_AFTER_S + 1
    assert store.run_view("r").health == "stale"


def test_malformed_frames_are_counted_by_reason_with_the_last_one_kept() -> None:
    store = Store()
    store.deliver(Batch(
        [],
        received=3,
        malformed=[(ProtocolError("not JSON: unexpected", "not JSON"), None),
                   (ProtocolError("too big", "oversized"), None)],
    ))
    # A recording's bad line: one frame each (received by default), and where it was.
    store.deliver(Batch([], malformed=[
        (ProtocolError("protocol version 2, expected 1", "wrong version"), "run.jsonl:17"),
    ]))
    counters = store.counters()
    assert counters.received == 4
    assert counters.malformed == 3
    assert counters.malformed_by_reason == {"not JSON": 1, "oversized": 1, "wrong version": 1}
    assert counters.last_malformed == "protocol version 2, expected 1 (run.jsonl:17)"


def test_snapshot_is_applied_without_gaps_then_live_messages_continue() -> None:
    store = Store()
    run = RunBuilder("r")
    sent = [run.run_start()] + [run.metrics(step, loss=1.0) for step in range(20)]
    snapshot = [sent[0], *sent[5:]]  # a snapshot holds a selection: gaps between its seqs are expected
    later = [run.metrics(20, loss=1.0)]
    # The snapshot then the live messages after it, spliced into one batch as a receiver hands it.
    store.deliver(Batch([*snapshot, *later], received=len(snapshot),
                        snapshot=Snapshot("r", 0, seq=sent[-1]["seq"], size=len(snapshot))))
    assert store.counters().gaps == 0
    assert store.counters().received == len(snapshot)  # the live ones were counted as they came
    assert list(store.series("r", "loss")[0]) == [*range(4, 21)]
    run.seq += 1  # one live message lost after the snapshot
    store.deliver(Batch([run.metrics(22, loss=1.0)]))
    assert store.counters().gaps == 1


def test_series_keep_at_least_their_capacity_and_slice_by_step() -> None:
    series = Series()
    total = 2 * SERIES_CAPACITY + 1234
    for step in range(total):
        series.append(step, float(step))
    assert SERIES_CAPACITY <= len(series) < 2 * SERIES_CAPACITY
    assert series.last() == (total - 1, float(total - 1))
    steps, values = series.between(total - 10, total + 5)
    assert steps == list(range(total - 10, total)) and values == [float(s) for s in steps]


def test_metric_window_around_an_event_and_nan_kept() -> None:
    store = Store()
    store.deliver(Batch(synthetic_run("r")))
    window = store.metric_window("r", 200, before=2, after=2, names=["loss", "lr"])
    steps, losses = window["loss"]
    assert steps == [198, 199, 200, 201, 202]
    assert math.isnan(losses[2]) and all(math.isfinite(v) for i, v in enumerate(losses) if i != 2)
    assert window["lr"][1] == [0.01] * 5


def test_run_view_and_gpus_from_a_whole_run() -> None:
    store = Store()
    store.deliver(Batch(synthetic_run("r", steps=300)))
    view = store.run_view("r")
    assert view.step == 299 and view.hosts == ("testhost",) and view.gpu_simulated
    assert view.throughput is not None and view.throughput.name == "samples_per_s"
    # No step times in this run: the last 20 steps' rates (1280-1299), harmonically averaged.
    assert (view.throughput.span(), round(view.throughput.value)) == ("20 steps", 1289)
    devices = store.devices("r")
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert devices[2].latest["util"] == 10.0 and devices[2].history["util"][-1] == 10.0
    assert devices[1].latest["throttle"] == ["hw_thermal"]
    assert {i.name: i.status for i in store.invariants("r")} == {
        "optimizer_changes_params": "ok",
        "grads_cleared": "violated",
    }


def test_gpu_history_is_bounded() -> None:
    store = Store()
    run = RunBuilder("r")
    store.deliver(Batch([run.gpu(step, [50.0]) for step in range(GPU_HISTORY + 50)]))
    assert len(store.devices("r")[0].history["util"]) == GPU_HISTORY


def test_versions_move_only_for_the_section_that_changed() -> None:
    store = Store()
    run = RunBuilder("r")
    store.deliver(Batch([run.run_start(), run.metrics(0, loss=1.0)]))
    before = store.versions("r")
    store.deliver(Batch([run.gpu(0, [90.0])]))
    after = store.versions("r")
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"gpu"}


def test_versions_are_never_reused_after_reset() -> None:
    store = Store()
    run = RunBuilder("r")
    store.deliver(Batch([run.run_start(), run.metrics(0, loss=1.0)]))
    seen = store.versions("r")["metrics"]
    store.reset()
    rebuilt = RunBuilder("r")
    store.deliver(Batch([rebuilt.run_start(), rebuilt.metrics(0, loss=9.0)]))
    assert store.versions("r")["metrics"] != seen
    assert list(store.series("r", "loss")[1]) == [9.0]


def test_notices_expire() -> None:
    store = Store()
    store.tell(Notice("a", "kept"))
    store.tell(Notice("b", "gone", ttl_s=-1))
    assert store.notices() == ["kept"]
    store.tell(Notice("a", None))
    assert store.notices() == []


def test_node_summaries_make_one_cell_per_gpu_or_rank_and_a_loss_band_across_nodes() -> None:
    """What the job grid and the loss band read, from summaries as node relays send them."""
    from publisher.wire.protocol import decode, encode, make_message
    from tuimon.store.job import BAND_PERIOD_S

    store = Store()

    def summary(node: str, ranks: list[int], step: int, losses: list[float], gpus: list[dict]) -> dict:
        body = {"node": node, "ranks": ranks, "steps": [step] * len(ranks),
                "metrics": {"loss": {"min": min(losses), "min_rank": ranks[losses.index(min(losses))],
                                     "median": sorted(losses)[len(losses) // 2], "max": max(losses),
                                     "max_rank": ranks[losses.index(max(losses))]}},
                "per_rank": {"step_time": [0.1] * len(ranks), "data_time": [0.0] * len(ranks),
                             "loss": losses},
                "gpus": gpus}
        return decode(encode(make_message("summary", run="job", rank=ranks[0], host=node, ts=1.0, seq=step,
                                          **body)))

    gpu = {"rank": 0, "index": 0, "util": 90, "mem_used": 20, "mem_total": 80, "temp_c": 61}
    store.deliver(Batch([summary("a", [0, 1], 5, [1.0, 3.0], [gpu]), summary("b", [2, 3], 5, [2.0, 2.5], [])],
                      received=2))
    view = store.job_view("job")
    assert view is not None and [node.name for node in view.nodes] == ["a", "b"] and view.ranks == 4
    first = view.nodes[0].cells
    assert [(c.rank, c.index) for c in first] == [(0, 0), (1, None)], "a GPU where reported, else the rank"
    assert first[0].values["mem"] == 0.25 and first[0].values["util"] == 90 and first[1].values["loss"] == 3.0
    time.sleep(BAND_PERIOD_S)  # the band takes a point at most every BAND_PERIOD_S, from every node
    store.deliver(Batch([summary("a", [0, 1], 6, [1.0, 3.0], [gpu]), summary("b", [2, 3], 6, [0.5, 4.0], [])],
                      received=2))
    steps, low, median, high = store.job_view("job").band
    assert steps == (5, 6) and (low[-1], median[-1], high[-1]) == (0.5, 3.5, 4.0), "lowest, median, highest"
    run = store.run_view("job")  # the summaries stand for the ranks' heartbeats: known, stepping, live
    assert run is not None and run.ranks == (0, 1, 2, 3) and run.hosts == ("a", "b")
    assert (run.step, run.health, run.gaps) == (6, "live", 0), "the relays' numbering is not the ranks'"
    silent = summary("b", [2, 3], 7, [0.5, 4.0], [])
    silent["beats"] = [{"silent_s": 0.1}, {"silent_s": 10.0}]  # rank 3 not heard for 10 s by its relay
    store.deliver(Batch([silent], received=1))
    assert store.run_view("job").health == "stale"
    assert store.job_view("other") is None


def test_a_job_seen_through_summaries_shows_the_rank_the_others_wait_for() -> None:
    """Behind a relay the viewer hears most ranks only through their nodes' summaries: the beats'
    stall fields give the same verdict as the heartbeats would (publisher/wire/stall.py), the rank
    outside the collective first, and a newer step clears it."""
    from publisher.wire.protocol import decode, encode, make_message

    clock = Clock()
    store = Store(clock=clock)
    waiting = ["/u/train.py:44 train",
               "/venv/lib/python3.11/site-packages/torch/distributed/x.py:9 all_reduce"]

    def summary(step: int, beats: list[dict]) -> dict:
        body = {"node": "a", "ranks": [0, 1, 2], "steps": [step] * 3, "metrics": {}, "beats": beats}
        return decode(encode(make_message("summary", run="job", rank=0, host="a", ts=clock.now, seq=step,
                                          **body)))

    def beat(stalled_s: float, stack: list[str], in_collective: bool) -> dict:
        return {"silent_s": 0.2, "stalled_s": stalled_s, "stall_after_s": 5.0, "stack": stack,
                "in_collective": in_collective, "cpu_share": 0.0, "same_place": True}

    store.deliver(Batch([summary(9, [{"silent_s": 0.1, "stalled_s": 0.1, "stall_after_s": 5.0}] * 3)]))
    assert store.run_view("job").stall is None
    clock.now += 7
    store.deliver(Batch([summary(9, [beat(7.0, waiting, True), beat(7.0, ["/u/data.py:4 fetch"], False),
                                     beat(7.0, waiting, True)])]))
    view = store.run_view("job")
    assert view.stall is not None
    assert (view.stall_rank, view.stall.state, view.stall_waiting) == (1, "stuck", 2)
    assert view.stall.where == "fetch (data.py:4)"
    clock.now += 2  # heard 2 s ago: the seconds go on
    assert round(store.run_view("job").stall.stalled_s) == 9
    store.deliver(Batch([summary(10, [{"silent_s": 0.1, "stalled_s": 0.0, "stall_after_s": 5.0}] * 3)]))
    assert store.run_view("job").stall is None, "steps resumed"
