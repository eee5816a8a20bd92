"""The job view: the grid of every GPU, the loss across ranks, the relays' findings, and the way
down to one node and one rank.

Like the dashboard, it reads the store on timers and redraws a panel only when what it shows
moved: node summaries (``versions(run)["nodes"]``), events (``["events"]``), relays (the source
version), and for the band chart at most :data:`CHART_HZ`. It never imports the dashboard that
opens it: it gets the store and the run, and is dismissed with the rank the user picked (or None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import Screen

from tuimon.store import JobView, Store
from tuimon.ui.footer import FittedFooter
from tuimon.ui.job.band import LossBand
from tuimon.ui.job.grid import GridState, JobGrid
from tuimon.ui.job.header import JobHeader
from tuimon.ui.job.node_screen import NodeScreen, NodeTable
from tuimon.ui.job.problem_list import ProblemList
from tuimon.ui.job.problems import Problem, current_marks, job_problems

#: Redraw rates (Hz): grid, header and problems (summaries come twice a second); the band chart.
NUMBERS_HZ = 2.0
CHART_HZ = 1.25


class JobScreen(Screen[int | None]):
    """The job of ``run`` in ``store``; ``state`` keeps the grid's figure and cursor between openings."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "next_metric", "Figure",
                tooltip="Grid figure: utilisation, memory, temperature, step, data, compute"),
        Binding("enter", "drill", "Node", tooltip="The ranks and GPUs of the node under the cursor"),
        Binding("escape", "close", "Dashboard", tooltip="Back to the single-run dashboard"),
        Binding("j", "close", "Dashboard", show=False, tooltip="Back to the single-run dashboard"),
    ]
    # The grid needs 32 rows for 512 nodes of 8 GPUs: the bottom panels give way on short terminals.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]  # noqa: RUF012 (Textual declares it a list)
    DEFAULT_CSS = """
    JobScreen #job-bottom {
        height: 11;
    }
    JobScreen.-short #job-bottom {
        height: 9;
    }
    JobScreen LossBand {
        width: 2fr;
    }
    JobScreen ProblemList {
        width: 3fr;
    }
    """

    def __init__(self, store: Store, run: str, state: GridState) -> None:
        super().__init__()
        self.store = store
        self.run = run
        self.state = state
        self._view: JobView | None = None
        self._problems: list[Problem] = []
        self._seen: dict[str, object] = {}

    def compose(self) -> ComposeResult:
        yield JobHeader(id="job-header")
        yield JobGrid(self.state, id="job-grid")
        with Horizontal(id="job-bottom"):
            yield LossBand(id="job-band")
            yield ProblemList(id="job-problems")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.query_one(JobGrid).focus()
        self.refresh_view()
        self.set_interval(1 / NUMBERS_HZ, self.refresh_view)
        self.set_interval(1 / CHART_HZ, self.refresh_band)

    # ----------------------------------------------------------------------------------- redraws

    def _changed(self, key: str, version: object) -> bool:
        if self._seen.get(key) == version:
            return False
        self._seen[key] = version
        return True

    def refresh_view(self) -> None:
        """Grid, header and problem list, each when what it shows moved (only while on top)."""
        if not self.is_current:
            return
        store, run = self.store, self.run
        versions = store.versions(run)
        now = store.now()
        if self._changed("nodes", versions["nodes"]):
            self._view = store.job_view(run)
        # Problems turn from current to over with time alone: looked at again every second.
        if self._changed("events", (versions["events"], int(now))):
            self._problems = job_problems(store.events(run), now)
            self.query_one(ProblemList).show(self._problems, now)
        view = self._view
        if view is None:
            return
        self.query_one(JobGrid).show(view, current_marks(self._problems))  # redraws if either changed
        current = sorted(problem.kind for problem in self._problems if problem.current)
        if self._changed("header", (versions["nodes"], store.status_version()[1], current)):
            self.query_one(JobHeader).show(view, len(store.relays()), self._problems)

    def refresh_band(self) -> None:
        if self._view is not None and self.is_current:
            self.query_one(LossBand).show(self._view.band)

    # ----------------------------------------------------------------------------------- actions

    def action_next_metric(self) -> None:
        self.query_one(JobGrid).next_metric()

    def action_drill(self) -> None:
        node = self.query_one(JobGrid).cursor_node
        if node is None:
            self.notify("no node yet: node relays send their summaries twice a second", timeout=3)
            return
        self.app.push_screen(NodeScreen(self.store, self.run, node.name), self._node_closed)

    def _node_closed(self, rank: int | None) -> None:
        if rank is not None:
            self.dismiss(rank)

    def action_close(self) -> None:
        self.dismiss(None)


def key_section(display: Callable[[Binding], str]) -> tuple[str, list[tuple[str, str]]]:
    """The job view's keys and marks, as the help screen lists them (``display``: how the app
    writes a binding's key)."""
    keys = [("← → ↑ ↓", "Move the cursor over the nodes (home, end: the first, the last)")]
    shown = [b for b in JobScreen.BINDINGS if isinstance(b, Binding) and b.show]
    keys += [(display(binding), binding.tooltip or binding.description) for binding in shown]
    node_keys = [b for b in (*NodeScreen.BINDINGS, *NodeTable.BINDINGS) if isinstance(b, Binding)]
    keys += [(f"{display(binding)} (node)", binding.tooltip or binding.description) for binding in node_keys]
    keys += [
        ("▲ ❚ ✖", "A straggler, a hung rank, a lost rank or relay (grid, problems)"),
        ("▁▂▃…█ ·", "Levels (contrast theme; else colours), no data; [ ] ◆ ▶ the cursor"),
    ]
    return "Job view (j, when the source is a relay)", keys
