"""A git working copy, driven through git's own command line, with errors a user can act on.

git is run as a program with argument lists (never through a shell): its command line is its
stable interface, and the user's configuration, credentials, hooks and remotes then apply exactly
as when they run git themselves (https://git-scm.com/docs/git). Only the plumbing-style outputs
meant for scripts are read (``-z`` lists, ``--porcelain``, exit codes of ``--quiet``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuimon.errors import UserError


@dataclass(frozen=True)
class Upstream:
    """Where the current branch is pulled from and pushed to (``branch.<name>.remote``/``.merge``)."""

    remote: str
    ref: str

    def __str__(self) -> str:
        return f"{self.remote}/{self.ref.removeprefix('refs/heads/')}"


class WorkingCopy:
    """A checked-out branch with an upstream: what a sync pulls into and pushes from."""

    def __init__(self, root: Path, branch: str, upstream: Upstream, identity: Sequence[str]) -> None:
        self.root = root
        self.branch = branch
        self.upstream = upstream
        self._identity = tuple(identity)

    @classmethod
    def open(cls, folder: Path, *, fallback_author: str) -> WorkingCopy:
        """The working copy ``folder`` is in; a one-line error when it is none, or has no upstream."""
        if not folder.is_dir():
            raise UserError(f"{folder} is not a folder (give a git working copy: --repo DIR)")
        top = _git(folder, ["rev-parse", "--show-toplevel"])
        if top.returncode != 0:
            raise UserError(f"{folder} is not a git working copy (git clone the team's repository there)")
        root = Path(top.stdout.strip())
        if _in_progress(root, "rebase-merge", "rebase-apply", "MERGE_HEAD"):
            raise UserError(
                f"{root} is in the middle of a rebase or merge: finish it or abort it "
                "(git rebase --abort / git merge --abort), then sync again"
            )
        branch = _git(root, ["symbolic-ref", "--quiet", "--short", "HEAD"])
        if branch.returncode != 0:
            raise UserError(f"{root} is not on a branch (detached HEAD): git switch to one, then sync")
        name = branch.stdout.strip()
        remote, ref = (_config(root, f"branch.{name}.{key}") for key in ("remote", "merge"))
        if not remote or not ref:
            remotes = _git(root, ["remote"]).stdout.split()
            if not remotes:
                raise UserError(f"{root} has no remote to share through (git remote add origin URL)")
            raise UserError(
                f"branch {name} of {root} has no upstream to pull from and push to "
                f"(git push -u {remotes[0]} {name})"
            )
        return cls(root, name, Upstream(remote, ref), _identity(root, fallback_author))

    def run(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Run git; its output, or a `UserError` quoting git's own reason."""
        done = self.attempt(*args, env=env)
        if done.returncode != 0:
            raise UserError(f"git {args[0]} failed in {self.root}: {reason(done)}")
        return done.stdout

    def attempt(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run git and return what happened, failure included (the caller decides what it means)."""
        return _git(self.root, [*self._identity, *args], env=env)

    def succeeds(self, *args: str) -> bool:
        return self.attempt(*args).returncode == 0

    def blob(self, object_id: str) -> bytes:
        """A file's content as git stores it (one side of a conflict), bytes as they are."""
        done = _run(self.root, ["cat-file", "blob", object_id])
        if done.returncode != 0:
            raise UserError(f"git cat-file failed in {self.root}: {_text(done.stderr)}")
        return done.stdout

    def rebasing(self) -> bool:
        return _in_progress(self.root, "rebase-merge")

    def conflicts(self) -> dict[str, dict[int, str]]:
        """Unmerged paths: path -> {stage: object id}; stage 1 is the common base and, while
        rebasing, 2 the upstream side and 3 the local commit being replayed
        (https://git-scm.com/docs/git-read-tree#_3_way_merge, https://git-scm.com/docs/git-rebase)."""
        found: dict[str, dict[int, str]] = {}
        for record in filter(None, self.run("ls-files", "--unmerged", "-z").split("\0")):
            meta, _, path = record.partition("\t")
            _mode, object_id, stage = meta.split()
            found.setdefault(path, {})[int(stage)] = object_id
        return found

    def head(self) -> str | None:
        """The current commit; None on a branch with no commit yet (a clone of an empty repository)."""
        done = self.attempt("rev-parse", "--quiet", "--verify", "HEAD")
        return done.stdout.strip() if done.returncode == 0 else None


def reason(done: subprocess.CompletedProcess[str]) -> str:
    """git's one-line reason for a failure: its first ``fatal:``/``error:`` line, else its first line."""
    lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("fatal:", "error:")):
            return line.split(":", 1)[1].strip()
    return lines[0] if lines else f"exit status {done.returncode}"


def _git(
    cwd: Path, args: Sequence[str], *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = _run(cwd, args, env=env)
    return subprocess.CompletedProcess(done.args, done.returncode, _text(done.stdout), _text(done.stderr))


def _run(
    cwd: Path, args: Sequence[str], *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
        )
    except FileNotFoundError:
        raise UserError(
            "git is not installed (or not on PATH): syncing the knowledge base runs git"
        ) from None


def _text(output: bytes) -> str:
    """git's output as text; paths that are not UTF-8 survive the round trip (surrogate escapes)."""
    return output.decode("utf-8", "surrogateescape")


def _in_progress(root: Path, *states: str) -> bool:
    """Whether a rebase or merge has stopped here (git keeps its state under these names in .git)."""
    return any(
        (root / _git(root, ["rev-parse", "--git-path", state]).stdout.strip()).exists() for state in states
    )


def _config(root: Path, key: str) -> str:
    return _git(root, ["config", "--get", key]).stdout.strip()


def _identity(root: Path, author: str) -> list[str]:
    """``-c user.name=... -c user.email=...`` for what git's configuration lacks, else nothing.

    A sync commits (and a rebase re-commits), and git refuses to commit without an identity it
    trusts (https://git-scm.com/docs/git-commit#_commit_information); rather than fail on a
    host nobody configured git on, commit as the knowledge base's author on this host.
    """
    if all(
        _git(root, ["var", ident]).returncode == 0 for ident in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT")
    ):
        return []
    local = re.sub(r"[^A-Za-z0-9._-]+", "-", author).strip("-.") or "tuimon"
    fallback = {
        "user.name": f"{author} (tuimon)",
        "user.email": f"{local}@{socket.gethostname() or 'localhost'}",
    }
    return [
        option
        for key, value in fallback.items()
        if not _config(root, key)
        for option in ("-c", f"{key}={value}")
    ]
