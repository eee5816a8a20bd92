"""``tuimon incidents ...`` end to end, in real processes, on a real knowledge-base folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from publisher.wire.protocol import encode, make_message


def _tuimon(
    *args: str,
    kb: Path | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    expect: int = 0,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "TUIMON_AUTHOR": "alice", "NO_COLOR": "1"}
    full_env.pop("TUIMON_KB", None)  # only --kb or the test's own env may choose the knowledge base
    full_env.update(env or {})
    command = [sys.executable, "-m", "tuimon.cli", "incidents", *args]
    if kb is not None:
        command += ["--kb", str(kb)]
    done = subprocess.run(command, capture_output=True, text=True, input=stdin, env=full_env, timeout=120)
    assert done.returncode == expect, done.stderr
    return done


def test_incident_workflow_from_the_command_line(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    number = _tuimon(
        "new",
        "--title",
        "NCCL timeout on node3",
        "--kind",
        "loss_spike",
        "--tag",
        "nccl",
        "--steps",
        "100-200",
        "--rank",
        "3",
        kb=kb,
    ).stdout.strip()
    assert number == "1"
    assert _tuimon("add-note", "1", "saw the grad-norm climb", kb=kb).stdout == "added note to #1\n"
    _tuimon("add-note", "#1", "-", kb=kb, stdin="a note\nfrom stdin\n")
    _tuimon("tried", "1", "lowered lr to 1e-4", "--outcome", "no-effect", "--step", "150", kb=kb)
    _tuimon("status", "1", "resolved", "--note", "fixed by restarting rank 3", kb=kb)
    assert _tuimon("status", "1", "resolved", kb=kb).stdout == "#1 is already resolved\n"
    _tuimon("edit", "1", "--root-cause", "flaky NIC", "--tag", "network", kb=kb)
    _tuimon("tick", "1", "check-1", kb=kb)

    listed = json.loads(_tuimon("list", "--status", "resolved", "--json", kb=kb).stdout)
    assert [(i["number"], i["tags"], i["root_cause"], i["created_by"]) for i in listed] == [
        (1, ["nccl", "network"], "flaky NIC", "alice")
    ]
    assert json.loads(_tuimon("list", "--status", "open", "--json", kb=kb).stdout) == []
    shown = json.loads(_tuimon("show", "1", "--json", kb=kb).stdout)
    assert [e["type"] for e in shown["timeline"]] == [
        "note",
        "note",
        "tried",
        "status_change",
        "runbook_step",
    ]
    assert shown["timeline"][1]["text"] == "a note\nfrom stdin"
    assert shown["timeline"][2]["outcome"] == "no_effect" and shown["timeline"][2]["step"] == 150
    assert shown["runbooks"][0]["steps"][0]["checked"] is True
    markdown = _tuimon("show", "1", kb=kb).stdout
    assert markdown.startswith("# #1 NCCL timeout on node3\n")

    found = _tuimon("search", "grad-norm", kb=kb).stdout
    assert "note: saw the [grad-norm] climb" in found
    hits = json.loads(_tuimon("search", '"lowered lr"', "--json", kb=kb).stdout)
    assert [(h["incident"]["number"], h["matched"], h["outcome"]) for h in hits] == [
        (1, "tried", "no_effect")
    ]
    assert "seen before: 1 incident, 1 resolved" in _tuimon("similar", "loss_spike", kb=kb).stdout


def test_export_and_import_through_the_command_line(tmp_path: Path) -> None:
    kb, copy = tmp_path / "kb", tmp_path / "copy"
    _tuimon("new", "--title", "first", kb=kb)
    _tuimon("new", "--title", "second", kb=kb)
    _tuimon("add-note", "2", "hello | world", kb=kb)
    out = _tuimon("export", "--out", str(tmp_path / "md"), kb=kb).stdout
    assert out.startswith("2 written, 0 unchanged")
    assert _tuimon("export", "--out", str(tmp_path / "md"), "2", kb=kb).stdout.startswith(
        "0 written, 1 unchanged"
    )
    report = _tuimon("import", str(tmp_path / "md"), kb=copy).stdout
    assert report == "2 files read: 2 new incidents, 0 updated, 1 timeline entries added\n"
    _tuimon("export", "--out", str(tmp_path / "md2"), kb=copy)
    assert {p.name: p.read_bytes() for p in (tmp_path / "md").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "md2").iterdir()
    }
    broken = tmp_path / "md" / "0001-first.md"
    broken.write_text(broken.read_text().replace("**Severity:** warning", "**Severity:** awful"))
    failed = _tuimon("import", str(tmp_path / "md"), kb=copy, expect=1)
    assert f"tuimon: skipped {broken}:7: unknown severity 'awful'" in failed.stderr
    assert failed.stdout.startswith("1 files read: 0 new incidents")


def test_open_from_a_recording_on_the_command_line(tmp_path: Path) -> None:
    """Named by the prefix `tuimon run --record runs/r` wrote it with, as every command takes it."""
    recording = tmp_path / "runs" / "r.rank0.pid7.jsonl"
    recording.parent.mkdir()
    messages = [
        make_message(
            "metrics", run="r", rank=0, host="h", ts=float(step), seq=step, step=step, metrics={"loss": 1.0}
        )
        for step in range(90, 111)
    ]
    messages.append(
        make_message(
            "event",
            run="r",
            rank=0,
            host="h",
            ts=200.0,
            seq=500,
            step=100,
            id="0-1",
            severity="critical",
            kind="nonfinite_loss",
            message="loss is nan",
            details={},
            count=1,
        )
    )
    recording.write_bytes(b"".join(encode(m) + b"\n" for m in messages))
    created = json.loads(
        _tuimon(
            "new",
            "--recording",
            str(tmp_path / "runs" / "r"),
            "--event",
            "0-1",
            "--window",
            "5",
            "--json",
            kb=tmp_path / "kb",
        ).stdout
    )
    assert created["title"] == "nonfinite_loss at step 100, run r", "short: the message is in the timeline"
    assert (created["severity"], created["kinds"], created["run"]) == ("critical", ["nonfinite_loss"], "r")
    shown = json.loads(_tuimon("show", str(created["id"])[:8], "--json", kb=tmp_path / "kb").stdout)
    [metrics] = [c for c in shown["context"] if c["kind"] == "metrics"]
    assert metrics["data"]["steps"] == list(range(95, 106))
    assert any("loss is nan" in entry["text"] for entry in shown["timeline"] if entry["type"] == "event")


def test_errors_are_one_line_and_kb_comes_from_the_environment(tmp_path: Path) -> None:
    env = {"TUIMON_KB": str(tmp_path / "env-kb")}
    missing = _tuimon("show", "7", env=env, expect=2)
    kb = tmp_path / "env-kb"
    assert missing.stderr == f"tuimon: error: no incident #7 in the knowledge base at {kb} ($TUIMON_KB)\n"
    assert _tuimon("new", "--title", "x", env=env).stdout == "1\n"
    where = json.loads(_tuimon("where", "--json", env=env).stdout)
    assert (where["path"], where["chosen_by"], where["incidents"]) == (
        str(tmp_path / "env-kb"),
        "$TUIMON_KB",
        1,
    )
    bad_query = _tuimon("search", "NOT", env=env, expect=2)
    assert bad_query.stderr.startswith("tuimon: error: cannot search for 'NOT'")
    assert "Traceback" not in _tuimon("tried", "1", "x", "--step", "nope", env=env, expect=2).stderr


@pytest.mark.parametrize("args", [["--help"], ["new", "--help"], ["search", "--help"]])
def test_help(args: list[str], tmp_path: Path) -> None:
    assert "usage: tuimon incidents" in _tuimon(*args, kb=None).stdout
