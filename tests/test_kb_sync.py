"""``tuimon incidents sync`` end to end: two hosts (two knowledge bases, two clones) and one bare
repository, real git, real processes. No user configuration leaks in: HOME is the test's folder."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuimon.kb import IncidentDraft, KnowledgeBase
from tuimon.kb.markdown_import import ParsedIncident
from tuimon.kb.merge3 import merge

#: A git identity for the tests' own commits; sync itself must work without one (see below).
IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


class Host:
    """One engineer's host: a knowledge base and a clone of the team repository."""

    def __init__(self, tmp_path: Path, name: str, author: str, remote: Path) -> None:
        self.kb = tmp_path / f"kb-{name}"
        self.clone = tmp_path / f"clone-{name}"
        self.author = author
        self.env = _env(tmp_path)
        git(tmp_path, "clone", "--quiet", str(remote), str(self.clone), env=self.env)

    def tuimon(self, *args: str, expect: int = 0, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {**self.env, "TUIMON_AUTHOR": self.author, **env}
        command = [sys.executable, "-m", "tuimon.cli", "incidents", *args, "--kb", str(self.kb)]
        done = subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=120)
        assert done.returncode == expect, done.stdout + done.stderr
        return done

    def sync(self, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        return self.tuimon("sync", "--repo", str(self.clone), *args, expect=expect)

    def show(self, ref: str = "1") -> dict:
        return json.loads(self.tuimon("show", ref, "--json").stdout)


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "TUIMON_", "XDG_"))}
    return {**env, **IDENTITY, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "NO_COLOR": "1"}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    path = tmp_path / "team.git"
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(path), env=_env(tmp_path))
    return path


@pytest.fixture
def hosts(tmp_path: Path, remote: Path) -> tuple[Host, Host]:
    return Host(tmp_path, "a", "alice", remote), Host(tmp_path, "b", "bob", remote)


def _texts(host: Host) -> list[str]:
    return [entry["text"] for entry in host.show()["timeline"]]


def _settled(host: Host) -> None:
    """Not mid-rebase, nothing uncommitted or unpushed, and another sync has nothing to do (numbers
    differ between hosts, yet no host rewrites another's files)."""
    assert not (host.clone / ".git" / "rebase-merge").exists()
    assert git(host.clone, "status", "--porcelain") == ""
    assert git(host.clone, "rev-list", "--count", "@{upstream}..HEAD").strip() == "0"
    lines = host.sync().stdout.splitlines()
    assert lines[:2] == ["exported 0 changed files into incidents/", "nothing new to commit"]
    assert "nothing to push" in lines


def test_an_incident_opened_on_one_host_reaches_the_other(hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    a.tuimon("new", "--title", "NCCL timeout on node3", "--kind", "loss_spike")
    lines = a.sync().stdout.splitlines()
    assert lines[0] == "exported 1 changed files into incidents/"
    assert lines[1].startswith("committed ")
    assert "pushed to origin/main" in lines
    assert lines[-1].endswith("1 files exported, 0 incidents from others, pushed")

    lines = b.sync().stdout.splitlines()
    assert "pulled 1 commits from origin/main: 1 new or changed incidents from others" in lines
    assert b.show()["incident"]["id"] == a.show()["incident"]["id"]
    assert b.show()["incident"]["title"] == "NCCL timeout on node3"
    assert [p.name for p in (b.clone / "incidents").iterdir()] == ["0001-nccl-timeout-on-node3.md"]

    for host in (a, b):
        _settled(host)


def test_notes_written_on_two_hosts_are_both_kept(hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    a.tuimon("new", "--title", "Loss spike after warm-up")
    a.sync()
    b.sync()
    a.tuimon("add-note", "1", "alice: grad-norm jumped at 12000")
    a.tuimon("edit", "1", "--summary", "spike at warm-up end", "--tag", "lr")
    b.tuimon("add-note", "1", "bob: same on rank 5")
    b.tuimon("edit", "1", "--root-cause", "warm-up too short", "--tag", "warmup")
    b.tuimon("status", "1", "investigating")

    a.sync()
    merged = b.sync().stdout  # the rebase stops on the file both changed: merged, not refused
    assert "pulled 1 commits from origin/main: 1 new or changed incidents from others" in merged
    a.sync()

    for host in (a, b):
        assert _texts(host) == ["alice: grad-norm jumped at 12000", "bob: same on rank 5", ""]
        incident = host.show()["incident"]
        assert (incident["summary"], incident["root_cause"]) == ("spike at warm-up end", "warm-up too short")
        assert (incident["status"], sorted(incident["tags"])) == ("investigating", ["lr", "warmup"])
        _settled(host)
    assert a.show() == b.show()


def test_a_text_both_hosts_changed_differently_is_a_conflict_that_changes_nothing(
    hosts: tuple[Host, Host],
) -> None:
    a, b = hosts
    a.tuimon("new", "--title", "GPU throttling")
    a.sync()
    b.sync()
    a.tuimon("edit", "1", "--root-cause", "a failing fan")
    b.tuimon("edit", "1", "--root-cause", "the room is too hot")
    b.tuimon("add-note", "1", "bob's note survives the refusal")
    a.sync()
    upstream = git(a.clone, "rev-parse", "HEAD")
    b_commit_before = git(b.clone, "rev-parse", "HEAD")

    refused = b.sync(expect=2)
    assert "tuimon: error: cannot merge what others pushed" in refused.stderr
    assert "incidents/0001-gpu-throttling.md: both sides changed the root cause of #1" in refused.stderr
    assert "(here by bob, upstream by alice)" in refused.stderr
    assert b.show()["incident"]["root_cause"] == "the room is too hot"
    assert _texts(b) == ["bob's note survives the refusal"]
    assert not (b.clone / ".git" / "rebase-merge").exists()
    assert git(b.clone, "status", "--porcelain") == ""
    assert git(b.clone, "rev-parse", "HEAD") != b_commit_before  # b's export was committed, not lost
    assert git(b.clone, "ls-remote", "origin", "main").split()[0] == upstream.strip()

    # Once bob takes alice's text, the sync goes through, with his note.
    b.tuimon("edit", "1", "--root-cause", "a failing fan")
    b.sync()
    a.sync()
    for host in (a, b):
        assert host.show()["incident"]["root_cause"] == "a failing fan"
        assert _texts(host) == ["bob's note survives the refusal"]
        _settled(host)


def test_no_push_and_a_host_without_a_git_identity(tmp_path: Path, remote: Path) -> None:
    a = Host(tmp_path, "a", "alice", remote)
    for name in IDENTITY:
        del a.env[name]
    a.tuimon("new", "--title", "first")
    dry = a.sync("--no-push").stdout
    assert "not pushed (--no-push): 1 commits wait for the next sync" in dry
    assert git(a.clone, "ls-remote", "origin") == ""
    assert git(a.clone, "log", "-1", "--format=%an").strip() == "alice (tuimon)"
    assert "pushed to origin/main" in a.sync().stdout
    assert git(a.clone, "ls-remote", "origin", "main") != ""


def test_the_working_copy_can_come_from_the_config_file_and_the_folder_from_folder(
    tmp_path: Path, remote: Path
) -> None:
    a = Host(tmp_path, "a", "alice", remote)
    config = tmp_path / "home" / ".config" / "tuimon" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[kb]\nsync_repo = "../../../clone-a"\n')
    a.tuimon("new", "--title", "from the config")
    assert (
        "exported 1 changed files into team/incidents/"
        in a.tuimon("sync", "--folder", "team/incidents").stdout
    )
    assert (a.clone / "team" / "incidents" / "0001-from-the-config.md").exists()


def test_errors_are_one_line(tmp_path: Path, remote: Path) -> None:
    a = Host(tmp_path, "a", "alice", remote)

    def error(*args: str, **env: str) -> str:
        stderr = a.tuimon("sync", *args, expect=2, **env).stderr
        assert stderr.count("\n") == 1 and stderr.startswith("tuimon: error: "), stderr
        return stderr

    plain = tmp_path / "plain"
    plain.mkdir()
    assert "is not a git working copy" in error("--repo", str(plain))
    assert "is not a folder" in error("--repo", str(tmp_path / "missing"))
    alone = tmp_path / "alone"
    git(tmp_path, "init", "--quiet", str(alone))
    assert "has no remote to share through (git remote add origin URL)" in error("--repo", str(alone))
    git(alone, "remote", "add", "origin", str(remote))
    assert "has no upstream to pull from and push to" in error("--repo", str(alone))
    assert "say which git working copy to sync through" in error()
    assert "must be a folder inside the working copy" in error("--repo", str(a.clone), "--folder", "..")
    no_git = tmp_path / "no-git-here"
    no_git.mkdir()
    assert "git is not installed" in error("--repo", str(a.clone), PATH=str(no_git))

    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    a.tuimon("new", "--title", "refused")
    assert "push to origin/main was rejected [remote rejected]" in error("--repo", str(a.clone))


def test_the_field_by_field_merge(tmp_path: Path) -> None:
    """What the sync's conflict resolution decides, field by field (the end-to-end tests above show
    it in use)."""
    with KnowledgeBase.open(tmp_path / "kb", author="alice") as kb:
        base = kb.open_incident(IncidentDraft(title="t", tags=["a", "b"], summary="s"))
    mine = dataclasses.replace(
        base, tags=("a", "b", "c"), severity="critical", updated_at="2030-01-01T00:00:01.000Z"
    )
    theirs = dataclasses.replace(
        base, tags=("b",), severity="info", status="mitigated", updated_at="2030-01-01T00:00:02.000Z"
    )
    version = merge(base, ParsedIncident(mine, (), ()), ParsedIncident(theirs, (), ()), "carol").version
    assert version is not None
    merged = version.incident
    # "a" removed on their side, "c" added on mine; both changed severity: the later side's; only
    # they changed the status; the result is neither side, so it is a new version by the merger.
    assert (merged.tags, merged.severity, merged.status) == (("b", "c"), "info", "mitigated")
    # Its stamp is later than both, even when this clock is behind theirs (here: years behind).
    assert (merged.updated_by, merged.updated_at) == ("carol", "2030-01-01T00:00:02.001Z")
    same = merge(base, ParsedIncident(theirs, (), ()), ParsedIncident(theirs, (), ()), "carol").version
    assert same is not None and same.incident == theirs
    texts = [dataclasses.replace(base, summary=text) for text in ("mine", "theirs")]
    refused = merge(None, *(ParsedIncident(version, (), ()) for version in texts), "carol")
    assert (refused.version, refused.conflicts) == (None, ("summary",))


def test_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tuimon.cli", "incidents", "sync", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    for text in ("--repo DIR", "--folder PATH", "--no-push", "git pull --rebase", "sync_repo"):
        assert text in " ".join(done.stdout.split())
