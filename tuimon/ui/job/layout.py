"""Where the job grid puts its cells: the densest arrangement that still fits, chosen per frame.

Three arrangements, tried in order, the first whose rows fit the height wins:

- ``named``: each node a block headed by its name, its GPUs as wide cells, as few nodes a row as
  the height allows (small jobs read as a list of nodes);
- ``gpus``: one character per GPU, each node a block between separators, rows labelled with
  the index of their first node (512 nodes of 8 GPUs: 16 nodes a row, 32 rows, in 160 columns);
- ``nodes``: one character per node, showing its worst GPU, in groups of :data:`NODE_GROUP`
  (the same job in 80 columns: 64 nodes a row, 8 rows). Rows that still do not fit scroll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Nodes between separators when a node is one character.
NODE_GROUP = 8
#: Characters of a node's name shown in the named arrangement (the end: it tells nodes apart).
NAME_CHARS = 14

Mode = Literal["named", "gpus", "nodes"]


@dataclass(frozen=True)
class GridLayout:
    mode: Mode
    #: Nodes a row.
    per_row: int
    #: Rows in all (the grid scrolls when they exceed its height).
    rows: int
    #: Columns of one GPU in the named arrangement (a glyph or two, then a gap); 1 otherwise.
    cell_width: int = 1
    #: Columns of a node's name (named arrangement).
    name_width: int = 0
    #: Columns of a row's label: a cursor mark and the index of the row's first node.
    label_width: int = 0

    def row_of(self, node: int) -> int:
        return node // self.per_row

    def cells_width(self, cells: int) -> int:
        """Columns of a node's cells in the GPU arrangements."""
        return cells if self.cell_width == 1 else cells * self.cell_width - 1


def short_name(name: str) -> str:
    return name if len(name) <= NAME_CHARS else "…" + name[-(NAME_CHARS - 1):]


def _rows(count: int, per_row: int) -> int:
    return -(-count // per_row)


def choose_layout(count: int, cells: int, names: list[str], width: int, height: int) -> GridLayout:
    """The arrangement of ``count`` nodes of up to ``cells`` cells each in ``width`` x ``height``."""
    cells = max(cells, 1)
    height = max(height, 1)
    name_width = max((len(short_name(name)) for name in names), default=1)
    for cell_width in (3, 2, 1):
        layout = GridLayout("named", 1, count, cell_width, name_width)
        node_width = 1 + name_width + 1 + layout.cells_width(cells)  # separator, name, space, cells
        fit = (width - 1) // node_width  # a separator closes the row
        if fit >= 1 and _rows(count, fit) <= height:
            per_row = min(fit, _rows(count, height))  # as few a row as the height allows: a list
            return GridLayout("named", per_row, _rows(count, per_row), cell_width, name_width)
    label_width = len(str(max(count - 1, 0))) + 1
    per_row = (width - label_width - 1) // (cells + 1)
    if per_row > 8:
        per_row -= per_row % 4  # rows labelled 0, 16, 32, ...: easier to count along
    if per_row >= 1 and _rows(count, per_row) <= height:
        return GridLayout("gpus", per_row, _rows(count, per_row), label_width=label_width)
    groups = max((width - label_width - 1) // (NODE_GROUP + 1), 1)
    per_row = groups * NODE_GROUP
    return GridLayout("nodes", per_row, _rows(count, per_row), label_width=label_width)
