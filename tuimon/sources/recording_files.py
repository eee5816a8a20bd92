"""What a user may name a recording by, the same in every command that reads one.

``tuimon run --record PREFIX`` writes one file per process (``PREFIX.rank<R>.pid<P>.jsonl``),
``tuimon demo`` and an embedded ``Monitor(record=FILE)`` one file. A reader takes any of: the file,
the ``--record`` prefix (every rank's file), or a folder (every recording in it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tuimon.errors import UserError

#: How a missing target is explained: what was looked for.
_LOOKED_FOR = ("no such file, no {target}.rank*.jsonl (what `--record {target}` writes), nor a folder of "
               ".jsonl files")


def recording_files(target: str | Path) -> list[Path] | None:
    """The recording files ``target`` names (a file, a ``--record`` prefix, a folder), None if none."""
    path = Path(target).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(path.glob("*.jsonl")) or None
    return sorted(path.parent.glob(f"{path.name}.rank*.jsonl")) or None


def resolve_recordings(targets: Iterable[str | Path], what: str = "recording") -> list[Path]:
    """Every file the ``targets`` name, in order; a :class:`UserError` for one that names none
    (``what``: how the error calls it)."""
    files: list[Path] = []
    for target in targets:
        found = recording_files(target)
        if found is None:
            raise UserError(f"no {what} {target}: {_LOOKED_FOR.format(target=target)}")
        files += [path for path in found if path not in files]
    return files
