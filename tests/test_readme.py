"""The README works as printed: its example trains and records, its commands exist with the options
it gives them, its `make` targets exist. A newcomer copies these first."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tuimon.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def command_lines(program: str) -> list[str]:
    """Every line of the README's shell blocks that runs ``program``, without its comment or pipe."""
    lines = []
    for block in blocks("sh"):
        for line in block.splitlines():
            command = line.split(" #", 1)[0].split(" | ", 1)[0].strip()
            if command.startswith(f"{program} "):
                lines.append(command)
    return lines


def test_the_embedding_example_trains_and_records_the_run(tmp_path: Path) -> None:
    (example,) = [block for block in blocks("python") if "with Monitor(" in block]
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    messages = [json.loads(line) for line in (tmp_path / "runs" / "exp1.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in messages if m["type"] == "metrics"]
    assert messages[0]["type"] == "run_start" and messages[-1]["type"] == "run_end"
    assert steps == list(range(1, 2001)) and messages[-1]["status"] == "completed"


@pytest.mark.parametrize("line", command_lines("tuimon"))
def test_each_tuimon_command_of_the_readme_parses(line: str) -> None:
    build_parser().parse_args(shlex.split(line)[1:])  # argparse exits on an unknown command or option


def test_each_make_target_of_the_readme_exists() -> None:
    targets = {line.split()[1] for line in command_lines("make")}
    assert {"demo", "test", "install"} <= targets
    for target in targets:
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
