"""How long the job view takes to draw a 4,096-GPU job (512 nodes x 8 GPUs) at 160x48.

The target: a frame of the 4,096-GPU grid in 50 ms or less. Measured on the real app
(Textual's Pilot, a headless terminal) over a store filled with real node summaries: the time to
read the job from the store and build the grid's content (every cell of every row, the legend), and,
for comparison in the same run, the store read alone.

    .venv/bin/python benchmarks/job_frame.py [--frames N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.jobs import big_job, job_store
from helpers.sources import FedSource

from tuimon.ui.app import TuimonApp
from tuimon.ui.job.grid import JobGrid
from tuimon.ui.job.problems import current_marks
from tuimon.ui.job.screen import JobScreen


async def measure(frames: int) -> tuple[list[float], list[float]]:
    store = job_store(big_job())
    app = TuimonApp(FedSource(store))
    full, read_only = [], []
    async with app.run_test(size=(160, 48)) as pilot:
        while not isinstance(app.screen, JobScreen) or not app.screen.query_one(JobGrid).nodes:
            await pilot.pause(0.05)
        screen, grid = app.screen, app.screen.query_one(JobGrid)
        marks = current_marks([])
        for _ in range(frames):
            started = time.perf_counter()
            view = store.job_view(screen.run)
            read_only.append(time.perf_counter() - started)
            grid.show(view, marks)  # a new view: the grid draws it again
            grid.render()
            full.append(time.perf_counter() - started)
            await pilot.pause(0.01)
    return full, read_only


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=30)
    args = parser.parse_args()
    full, read_only = asyncio.run(measure(args.frames))
    ms = lambda values: f"{statistics.median(values) * 1000:.1f} ms p50, {max(values) * 1000:.1f} ms max"  # noqa: E731
    print(f"job view of 4,096 GPUs at 160x48, {args.frames} frames")
    print(f"  store read (job_view):        {ms(read_only)}")
    print(f"  read + the whole grid drawn:  {ms(full)}   (target <= 50 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
