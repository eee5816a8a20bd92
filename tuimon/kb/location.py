"""Where the knowledge base lives and who is writing: ``--kb``, ``$TUIMON_KB``, config file, default.

The point of the knowledge base is that everyone on a training node writes into the same one, so
the location is resolved the same way by every entry point (CLI, dashboard, benchmark) and the
answer says where it came from: "why am I not seeing Bob's notes?" is answered by that source.
"""

from __future__ import annotations

import getpass
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tuimon.config import config_path, load_config
from tuimon.errors import UserError

KB_ENV = "TUIMON_KB"
AUTHOR_ENV = "TUIMON_AUTHOR"
CONFIG_KEY = "kb_dir"
#: The SQLite database inside the knowledge-base folder.
DB_FILE = "incidents.sqlite3"
#: Team runbooks inside the knowledge-base folder; they extend (and by file name override) the
#: runbooks shipped with tuimon.
RUNBOOKS_DIR = "runbooks"


@dataclass(frozen=True)
class KbLocation:
    """A resolved knowledge-base folder and how it was chosen (shown by ``tuimon incidents``)."""

    path: Path
    source: str

    @property
    def db_path(self) -> Path:
        return self.path / DB_FILE

    @property
    def runbooks_dir(self) -> Path:
        return self.path / RUNBOOKS_DIR


def default_kb_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_DATA_HOME/tuimon/kb``, else ``~/.local/share/tuimon/kb``: a single user's default."""
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "share")
    return Path(base) / "tuimon" / "kb"


def resolve_location(
    cli_value: str | os.PathLike[str] | None = None, env: Mapping[str, str] = os.environ
) -> KbLocation:
    """The knowledge-base folder: ``--kb``, then ``$TUIMON_KB``, then the config file, then the default.

    A relative ``kb_dir`` in the config file is taken relative to the config file's folder, so a
    team can keep one config next to the shared folder. Nothing is created here.
    """
    if cli_value:
        return KbLocation(Path(cli_value).expanduser().absolute(), "--kb")
    if env.get(KB_ENV):
        return KbLocation(Path(env[KB_ENV]).expanduser().absolute(), f"${KB_ENV}")
    config = config_path(env)
    configured = _configured_kb_dir(env)
    if configured is not None:
        path = configured if configured.is_absolute() else config.parent / configured
        return KbLocation(path.absolute(), f"{CONFIG_KEY} in {config}")
    return KbLocation(default_kb_dir(env).absolute(), "default")


def _configured_kb_dir(env: Mapping[str, str]) -> Path | None:
    value = load_config(env).get(CONFIG_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{config_path(env)}: '{CONFIG_KEY}' must be a folder path (a non-empty string)")
    return Path(value).expanduser()


def prepare_folder(location: KbLocation) -> None:
    """Create the folder if needed, and make a new database group-writable in a shared folder.

    SQLite creates its database with mode 0644 (less the umask) whatever the folder allows, so in a
    team folder (group-writable, ideally setgid) the first user would lock the others out. The WAL
    and shared-memory files copy the database file's mode, so fixing the database file is enough.
    """
    try:
        location.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the knowledge-base folder {location.path}: {exc.strerror}") from None
    folder_mode = location.path.stat().st_mode
    db = location.db_path
    if db.exists() or not folder_mode & stat.S_IWGRP:
        return
    try:
        fd = os.open(db, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660)
    except FileExistsError:
        return  # someone else created it a moment ago; their process fixes its mode
    except OSError as exc:
        raise UserError(f"cannot create {db}: {exc.strerror}") from None
    os.close(fd)
    group_mode = 0o664 if folder_mode & stat.S_IROTH else 0o660
    os.chmod(db, group_mode)


def resolve_author(cli_value: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """Who writes: ``--author``, else ``$TUIMON_AUTHOR``, else the Unix user name."""
    for candidate in (cli_value, env.get(AUTHOR_ENV)):
        if candidate and candidate.strip():
            return " ".join(candidate.split())
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"
