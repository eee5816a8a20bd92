"""Replaying recordings: loading, merging, pace, pause, speed and seek."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.recordings import write_recording
from helpers.runs import RunBuilder, synthetic_run
from helpers.waiting import wait_until

from publisher.wire.protocol import encode
from tuimon.errors import UserError
from tuimon.sources.replay import ReplaySource, load_recordings, parse_speed


@pytest.fixture
def players() -> Iterator[list[ReplaySource]]:
    started: list[ReplaySource] = []
    yield started
    for player in started:
        player.stop()


def play(players: list[ReplaySource], paths: list[Path], **kwargs: object) -> ReplaySource:
    player = ReplaySource(paths, **kwargs)
    player.start()
    players.append(player)
    return player


def shown_step(player: ReplaySource, run: str = "synthetic") -> int | None:
    view = player.store.run_view(run)
    return view.step if view else None


def test_missing_file_is_a_user_error_naming_it_and_what_was_looked_for(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(UserError) as error:
        load_recordings([missing])
    assert str(error.value).startswith(f"no recording {missing}: no such file, no {missing}.rank*.jsonl")
    assert "(what `--record" in str(error.value) and "nor a folder of .jsonl files" in str(error.value)


def test_a_folder_without_recordings_is_not_a_recording(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a recording")
    with pytest.raises(UserError, match=r"nor a folder of \.jsonl files"):
        load_recordings([tmp_path])


def test_file_without_messages_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text("hello\nworld\n")
    with pytest.raises(UserError) as error:
        load_recordings([path])
    assert "no tuimon messages" in str(error.value) and "notes.jsonl:1" in str(error.value)


def test_bad_lines_are_counted_with_their_line_numbers(tmp_path: Path, players: list[ReplaySource]) -> None:
    path = write_recording(
        tmp_path / "run.jsonl",
        synthetic_run(steps=20),
        bad_lines={3: b"{truncated", 7: b'{"v": 9, "type": "metrics"}'},
    )
    player = play(players, [path], speed=math.inf)
    wait_until(
        lambda: player.store.run_view("synthetic") and player.store.run_view("synthetic").health == "ended"
    )
    counters = player.store.counters()
    assert counters.malformed == 2
    assert counters.malformed_by_reason == {"not JSON": 1, "wrong version": 1}
    assert counters.last_malformed.endswith("(run.jsonl:7)")
    assert list(player.store.series("synthetic", "loss")[0]) == list(range(20))  # nothing else lost


def test_recordings_are_merged_by_time_keeping_each_file_in_order(tmp_path: Path) -> None:
    first, second = RunBuilder("a", t0=100.0), RunBuilder("b", t0=100.5)
    messages_a, messages_b = [], []
    for step in range(5):
        first.ts, second.ts = 100.0 + step, 100.5 + step
        messages_a.append(first.metrics(step, loss=1.0))
        messages_b.append(second.metrics(step, loss=1.0))
    messages_a[2]["ts"] = 99.0  # a clock step back inside one file must not reorder that file
    recording = load_recordings(
        [write_recording(tmp_path / "a.jsonl", messages_a), write_recording(tmp_path / "b.jsonl", messages_b)]
    )
    order = [(line[line.index(b'"run":"') + 7 :][:1], line) for line in recording.lines]
    # a's third message (ts 99) plays right after its predecessor, not before it.
    assert [run for run, _ in order] == [b"a", b"b", b"a", b"a", b"b", b"b", b"a", b"b", b"a", b"b"]
    lines_a = [line for run, line in order if run == b"a"]
    assert lines_a == [encode(m) for m in messages_a]
    assert recording.due == sorted(recording.due)


def test_playback_follows_the_recorded_pace_and_speed(recording: Path, players: list[ReplaySource]) -> None:
    slow = play(players, [recording], speed=1.0)
    fast = play(players, [recording], speed=16.0)
    time.sleep(1.0)
    slow_step, fast_step = shown_step(slow), shown_step(fast)
    # 1 s at 1x is ~10 steps of this recording (0.1 s a step); at 16x ~160.
    assert slow_step is not None and slow_step <= 20
    assert fast_step is not None and fast_step >= 5 * max(slow_step, 10)


def test_pause_stops_the_screen_and_resume_goes_on(recording: Path, players: list[ReplaySource]) -> None:
    player = play(players, [recording], speed=8.0)
    wait_until(lambda: (shown_step(player) or 0) > 10, what="some steps")
    player.set_paused(True)
    time.sleep(0.1)
    paused_at = shown_step(player)
    time.sleep(0.5)
    assert shown_step(player) == paused_at
    assert player.store.source_status().paused
    player.toggle_pause()
    wait_until(lambda: shown_step(player) > paused_at, what="playing again")


def test_speed_steps_through_the_choices(recording: Path) -> None:
    player = ReplaySource([recording], speed=1.0)
    player.faster()
    assert player.speed == 2.0
    for _ in range(20):
        player.faster()
    assert math.isinf(player.speed)
    for _ in range(20):
        player.slower()
    assert player.speed == 0.5


def test_seek_rebuilds_the_screen_at_the_target(recording: Path, players: list[ReplaySource]) -> None:
    player = play(players, [recording], speed=1.0, paused=True)
    player.seek_fraction(1.0)
    wait_until(lambda: shown_step(player) == 299, what="the end")
    assert [e.id for e in player.store.events("synthetic")] == ["0-1", "0-2"]
    player.seek_fraction(0.5)  # 15 s into a 30 s recording: step ~150, before the NaN at 200
    wait_until(lambda: shown_step(player) is not None and shown_step(player) < 200, what="the middle")
    assert 140 <= shown_step(player) <= 152
    assert [e.id for e in player.store.events("synthetic")] == ["0-1"]
    assert list(player.store.series("synthetic", "loss")[0]) == list(range(shown_step(player) + 1))
    assert player.store.counters().gaps == 0
    player.seek_relative(-10.0)
    wait_until(lambda: shown_step(player) < 60, what="10 s back")
    assert player.store.events("synthetic") == []
    player.seek_relative(+3.0)
    wait_until(lambda: shown_step(player) >= 70, what="3 s forward")
    assert player.store.source_status().paused


def test_as_fast_as_possible_plays_to_the_end(recording: Path, players: list[ReplaySource]) -> None:
    player = play(players, [recording], speed=parse_speed("max"))
    wait_until(lambda: player.store.source_status().position == 1.0, what="the end")
    assert player.store.run_view("synthetic").health == "ended"
    assert math.isinf(player.store.source_status().speed)


@pytest.mark.parametrize("text", ["3", "fast", "0", "-1"])
def test_bad_speed_is_a_user_error_listing_choices(text: str) -> None:
    with pytest.raises(UserError, match=re.escape("choose one of 0.5, 1, 2, 4, 8, 16, 32, 64, max")):
        parse_speed(text)


def test_speed_accepts_a_trailing_x() -> None:
    assert parse_speed("4x") == 4.0 and parse_speed("0.5") == 0.5
