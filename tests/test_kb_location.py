"""Where the knowledge base lives (--kb, $TUIMON_KB, config file, default) and who writes."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from tuimon.errors import UserError
from tuimon.kb import IncidentDraft, KnowledgeBase
from tuimon.kb.location import resolve_author, resolve_location


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), **extra}


def test_default_is_per_user_data_folder(tmp_path: Path) -> None:
    location = resolve_location(None, _env(tmp_path))
    assert location.path == tmp_path / "home" / ".local" / "share" / "tuimon" / "kb"
    assert location.source == "default"
    xdg = resolve_location(None, _env(tmp_path, XDG_DATA_HOME=str(tmp_path / "data")))
    assert xdg.path == tmp_path / "data" / "tuimon" / "kb"


def test_precedence_flag_then_env_then_config(tmp_path: Path) -> None:
    config = tmp_path / "home" / ".config" / "tuimon" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('kb_dir = "../../team-kb"\n')
    env = _env(tmp_path)
    from_config = resolve_location(None, env)
    # A relative kb_dir is relative to the config file's folder.
    assert from_config.path == (config.parent / "../../team-kb").absolute()
    assert "config.toml" in from_config.source
    from_env = resolve_location(None, {**env, "TUIMON_KB": str(tmp_path / "env-kb")})
    assert from_env.path == tmp_path / "env-kb"
    assert from_env.source == "$TUIMON_KB"
    from_flag = resolve_location(str(tmp_path / "flag-kb"), {**env, "TUIMON_KB": str(tmp_path / "env-kb")})
    assert from_flag.path == tmp_path / "flag-kb"
    assert from_flag.source == "--kb"


def test_broken_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "cfg" / "tuimon" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("kb_dir = [unclosed\n")
    with pytest.raises(UserError, match=r"config\.toml: not valid TOML"):
        resolve_location(None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HOME": str(tmp_path)})
    config.write_text("kb_dir = 3\n")
    with pytest.raises(UserError, match="must be a folder path"):
        resolve_location(None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HOME": str(tmp_path)})


def test_author_override_order() -> None:
    assert resolve_author("  Ada   Lovelace ", {"TUIMON_AUTHOR": "bob"}) == "Ada Lovelace"
    assert resolve_author(None, {"TUIMON_AUTHOR": "bob"}) == "bob"
    assert resolve_author(None, {}) == resolve_author(None, {"TUIMON_AUTHOR": "  "})
    assert resolve_author(None, {})  # the Unix user name


def test_opening_creates_folder_and_wal_database(tmp_path: Path) -> None:
    with KnowledgeBase.open(tmp_path / "new" / "kb", author="alice") as kb:
        assert kb.location.db_path.exists()
        assert kb.schema_version == 1
        with sqlite3.connect(kb.location.db_path) as other:
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert kb.author == "alice"


def test_shared_group_writable_folder_gives_group_writable_database(tmp_path: Path) -> None:
    shared = tmp_path / "team"
    shared.mkdir()
    os.chmod(shared, 0o2770)
    old_umask = os.umask(0o022)  # the usual umask would otherwise lock the team out
    try:
        with KnowledgeBase.open(shared, author="alice") as kb:
            kb.add_note(kb.open_incident(IncidentDraft(title="shared")).number, "hello")
    finally:
        os.umask(old_umask)
    mode = stat.S_IMODE((shared / "incidents.sqlite3").stat().st_mode)
    assert mode & stat.S_IWGRP, oct(mode)


def test_database_from_a_newer_tuimon_is_refused(tmp_path: Path) -> None:
    with KnowledgeBase.open(tmp_path, author="alice") as kb:
        kb.open_incident(IncidentDraft(title="kept"))
        db_path = kb.location.db_path
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
            "VALUES ('tuimon_kb', 'm999_future', '')"
        )
    with pytest.raises(UserError, match=r"written by a newer tuimon .*m999_future.*upgrade tuimon"):
        KnowledgeBase.open(tmp_path, author="alice")
