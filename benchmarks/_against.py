"""Running a benchmark on this tree and on another commit, alternately, in one run.

A shared 2-core machine drifts by more than most changes cost, so two figures taken minutes apart
cannot name a regression. Runs of the two trees alternate (ABBA: this tree first in even pairs, the
other first in odd ones) so that drift hits both alike, and several pairs give a median and a
spread. The other commit is checked out in a temporary git worktree and runs its own copy of the
benchmark script, with its own code first on ``sys.path`` (each script puts its tree's root there),
in the same virtual environment.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
Row = TypeVar("Row")


class AgainstError(RuntimeError):
    """The other commit cannot be checked out or its benchmark failed: said in one line."""


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` checked out in a temporary folder for the block, removed after."""
    folder = Path(tempfile.mkdtemp(prefix="tuimon-against-")) / "tree"
    added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev],
                           capture_output=True, text=True, check=False)
    if added.returncode != 0:
        raise AgainstError(f"cannot check out {rev!r}: {added.stderr.strip().splitlines()[-1]}")
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)],
                       capture_output=True, check=False)


def run_script(tree: Path, script: str, args: list[str]) -> str:
    """``tree``'s copy of ``benchmarks/<script>`` run with ``args``; its standard output."""
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args], cwd=tree,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise AgainstError(f"{script} failed in {tree}: {tail}")
    return done.stdout


def alternate(
    rev: str, pairs: int, script: str, args: list[str], parse: Callable[[str], Row],
    progress: Callable[[str], None] = print,
) -> tuple[list[Row], list[Row]]:
    """``pairs`` runs of this tree and of ``rev``, alternating; each run's output parsed."""
    here: list[Row] = []
    there: list[Row] = []
    with worktree(rev) as other:
        for pair in range(pairs):
            order = [("this tree", ROOT, here), (rev, other, there)]
            for name, tree, results in order if pair % 2 == 0 else order[::-1]:
                progress(f"pair {pair + 1}/{pairs}: {name}")
                results.append(parse(run_script(tree, script, args)))
    return here, there
