"""A job of many nodes as the viewer knows it: the latest summary of each node, and the loss band.

Node relays send one ``summary`` per node twice a second (docs/protocol.md). From the latest of
each, readers get one cell per GPU (per rank where no GPU is reported, as on a CPU run), grouped
by node, with the figures the job grid colours by; and the loss over time as the median across
nodes with the lowest and highest rank's loss around it (the min-max band). The band takes a point
when a reader looks, at most twice a second, from every node's latest summary: a 512-node job
costs one pass over its nodes per point, not one per summary received.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from publisher.wire.protocol import read_number

#: Seconds between two points of the loss band.
BAND_PERIOD_S = 0.5
#: Points of the band kept (at 2 a second: over an hour).
BAND_CAPACITY = 8_192
#: Figures a cell may be coloured by, in the order the grid offers them.
CELL_METRICS = ("util", "mem", "temp_c", "step_time", "data_time", "compute_time")


@dataclass(frozen=True)
class Cell:
    """One GPU of a node (``index`` None: a rank that reports no GPU)."""

    node: str
    rank: int
    index: int | None
    values: Mapping[str, float]


@dataclass(frozen=True)
class NodeView:
    name: str
    ranks: tuple[int, ...]
    steps: tuple[int | None, ...]
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class JobView:
    """Every node of a run, by name, and the loss band (steps, low, median, high)."""

    run: str
    nodes: tuple[NodeView, ...]
    band: tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...]]

    @property
    def cells(self) -> int:
        return sum(len(node.cells) for node in self.nodes)

    @property
    def ranks(self) -> int:
        return sum(len(node.ranks) for node in self.nodes)


class JobState:
    """What the store keeps of a run's node summaries (called under the store's lock)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self._band = (array("q"), array("d"), array("d"), array("d"))
        self._band_due = 0.0

    def add(self, summary: Mapping[str, Any]) -> None:
        self.nodes[summary["node"]] = summary

    def _extend_band(self) -> None:
        spreads = [node["metrics"].get("loss") for node in self.nodes.values()]
        spreads = [s for s in spreads if isinstance(s, Mapping) and "median" in s]
        steps = [step for node in self.nodes.values() for step in node.get("steps") or ()
                 if isinstance(step, int)]
        if not spreads or not steps:
            return
        step = max(steps)
        band_steps, lows, medians, highs = self._band
        if band_steps and step <= band_steps[-1]:
            return
        band_steps.append(step)
        lows.append(min(_number(s.get("min")) for s in spreads))
        medians.append(statistics.median(_number(s.get("median")) for s in spreads))
        highs.append(max(_number(s.get("max")) for s in spreads))
        if len(band_steps) > 2 * BAND_CAPACITY:
            for values in self._band:
                del values[:BAND_CAPACITY]

    def view(self, run: str, now: float) -> JobView:
        """The job now; the band takes its next point here, when due, from every node's latest."""
        if now >= self._band_due:
            self._band_due = now + BAND_PERIOD_S
            self._extend_band()
        nodes = tuple(_node_view(name, self.nodes[name]) for name in sorted(self.nodes))
        band_steps, lows, medians, highs = self._band
        return JobView(run, nodes, (tuple(band_steps), tuple(lows), tuple(medians), tuple(highs)))


def _number(value: Any) -> float:
    number = read_number(value) if not isinstance(value, bool) else None
    return math.nan if number is None else number


def _node_view(name: str, summary: Mapping[str, Any]) -> NodeView:
    ranks = tuple(summary["ranks"])
    per_rank = summary.get("per_rank") or {}

    def of_rank(i: int) -> dict[str, float]:
        return {key: _number(values[i]) for key in ("step_time", "data_time", "compute_time", "loss")
                if isinstance(values := per_rank.get(key), list) and i < len(values)}

    figures = {rank: of_rank(i) for i, rank in enumerate(ranks)}
    cells = []
    for device in summary.get("gpus") or ():
        rank = device.get("rank")
        if not isinstance(rank, int):
            continue
        used, total = _number(device.get("mem_used")), _number(device.get("mem_total"))
        values = {"util": _number(device.get("util")), "temp_c": _number(device.get("temp_c")),
                  "mem": used / total if total > 0 else math.nan, **figures.get(rank, {})}
        index = device.get("index")
        cells.append(Cell(name, rank, index if isinstance(index, int) else None, values))
    with_gpu = {cell.rank for cell in cells}
    cells += [Cell(name, rank, None, figures[rank]) for rank in ranks if rank not in with_gpu]
    cells.sort(key=lambda cell: (cell.rank, -1 if cell.index is None else cell.index))
    steps = tuple(step if isinstance(step, int) else None for step in summary.get("steps") or ())
    return NodeView(name, ranks, steps, tuple(cells))
