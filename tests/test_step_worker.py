"""The Monitor's step worker: steps finish off the training thread, in order, and none is lost at close."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from publisher.threads.step_worker import StepWorker


def test_items_are_handled_in_the_background_in_order_and_the_rest_at_close() -> None:
    handled: list[tuple[int, str]] = []
    worker = StepWorker(lambda item: handled.append((item, threading.current_thread().name)), lambda: None,
                        interval_s=0.01)
    for item in range(5):
        worker.submit(item)
    deadline = time.monotonic() + 2.0
    while len(handled) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert [item for item, _ in handled] == [0, 1, 2, 3, 4]
    assert {name for _, name in handled} == {"tuimon-steps"}, "not on the thread that submitted"
    worker.close()

    slow: list[int] = []
    lazy = StepWorker(slow.append, lambda: None, interval_s=60.0)
    lazy.submit(7)
    lazy.submit(8)
    lazy.close()  # long before the thread's next round: close handles what is left
    assert slow == [7, 8]


def test_a_failing_item_is_logged_once_and_the_others_go_through(caplog: pytest.LogCaptureFixture) -> None:
    handled: list[int] = []

    def handle(item: int) -> None:
        if item % 2:
            raise ZeroDivisionError("bug while finishing a step")
        handled.append(item)

    worker = StepWorker(handle, lambda: None, interval_s=60.0)
    for item in range(6):
        worker.submit(item)
    with caplog.at_level(logging.ERROR):
        worker.close()
    assert handled == [0, 2, 4]
    assert sum("finishing a step failed" in r.getMessage() for r in caplog.records) == 1


def test_a_full_queue_refuses_and_counts_instead_of_blocking() -> None:
    drops: list[None] = []
    handled: list[int] = []
    worker = StepWorker(handled.append, lambda: drops.append(None), interval_s=60.0, max_pending=3)
    for item in range(5):
        worker.submit(item)
    worker.close()
    assert handled == [0, 1, 2] and len(drops) == 2
