"""Property-based tests (Hypothesis): whatever arrives, every reader fails in the one way it may.

- the decoder raises ``ProtocolError`` and nothing else, for any bytes and any JSON shaped like a
  message; what it accepts, the store applies and every panel's formatting renders;
- what the publisher makes of any user value (``json_safe``, ``encode_fitted``) is accepted by
  the decoder;
- the Markdown readers (exported incidents, runbooks) raise their own ``file:line`` errors only;
- the ``tuimon incidents`` command line ends with an exit status, never a traceback.

The example counts keep the whole file to well under a minute; CI runs them derandomized, so a
failure there reproduces, and any failure is printed with the input that caused it.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import string
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from publisher.wire.jsonsafe import json_safe
from publisher.wire.protocol import MESSAGE_TYPES, ProtocolError, decode, encode_fitted, make_message
from tuimon import cli
from tuimon.errors import UserError
from tuimon.kb.markdown_import import ParseError, parse_incident
from tuimon.kb.runbooks import RunbookError, parse_runbook
from tuimon.sink import Batch
from tuimon.store import Store
from tuimon.ui.dashboard.gpu import find_outliers, render_device
from tuimon.ui.dashboard.header import health
from tuimon.ui.event_detail import context_table, detail_lines
from tuimon.ui.format import bar, duration, number, spark

settings.register_profile(
    "tuimon",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),  # more, to hunt: FUZZ_EXAMPLES=3000
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("tuimon")

# -- strategies -----------------------------------------------------------------------------------

numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from(["nan", "inf", "-inf"]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=40))
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
#: Values that are often the right type and sometimes not: what a buggy or hostile peer sends.
odd = st.one_of(json_values, numbers, st.text(max_size=300))
envelope = st.fixed_dictionaries(
    {
        "v": st.one_of(st.just(1), odd),
        "type": st.one_of(st.sampled_from(sorted(MESSAGE_TYPES)), odd),
        "run": st.one_of(st.sampled_from(["r", "run-2"]), odd),
        "rank": st.one_of(st.integers(0, 3), odd),
        "host": st.one_of(st.just("h"), odd),
        "ts": st.one_of(st.floats(0, 2e9), odd),
        "seq": st.one_of(st.integers(0, 10), odd),
    },
    optional={"step": st.one_of(st.integers(0, 2**64 - 1), odd)},
)
device = st.fixed_dictionaries(
    {"index": st.one_of(st.integers(0, 8), odd)},
    optional={field: odd for field in ("util", "mem_used", "mem_total", "temp_c", "power_w", "power_limit_w",
                                       "sm_clock_mhz", "ecc_errors", "name", "throttle")},
)
body = st.fixed_dictionaries(
    {},
    optional={
        "metrics": st.one_of(st.dictionaries(st.text(max_size=20), odd, max_size=6), odd),
        "devices": st.one_of(st.lists(device, max_size=4), odd),
        "severity": st.one_of(st.sampled_from(["info", "warning", "critical"]), odd),
        "kind": odd, "message": odd, "id": odd, "count": odd, "details": odd,
        "name": odd, "status": st.one_of(st.sampled_from(["ok", "violated", "completed", "failed"]), odd),
        "config": odd, "argv": odd, "world_size": odd, "seed": odd, "stats": odd, "snapshot": odd,
        "layers": odd, "error": odd, "simulated": odd,
    },
)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    return {**draw(envelope), **draw(body)}


# -- the wire ------------------------------------------------------------------------------------


@given(st.binary(max_size=2000))
def test_any_bytes_decode_to_a_message_or_a_protocol_error(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(frame)


@given(st.lists(messages(), min_size=1, max_size=8))
def test_whatever_decodes_is_applied_and_shown_without_an_error(candidates: list[dict[str, Any]]) -> None:
    accepted = []
    for candidate in candidates:
        try:
            frame = orjson.dumps(candidate)
        except (TypeError, orjson.JSONEncodeError):
            continue
        try:
            accepted.append(decode(frame))
        except ProtocolError:
            continue
    store = Store()
    store.deliver(Batch(accepted))
    assert store.counters().malformed == 0  # nothing the decoder accepts breaks the store
    for run in store.run_names():
        view = store.run_view(run)
        assert view is not None
        health(view, store.source_status(), store.now())
        devices = store.devices(run)
        find_outliers(devices)
        for device_view in devices:
            render_device(device_view, None, show_rank=True, show_name=True)
        for event in store.events(run):
            detail_lines(event.details)
            if event.step is not None:
                context_table(store.metric_window(run, event.step), event.step)
        for name in store.metric_names(run):
            store.series(run, name)


@given(json_values)
def test_what_the_publisher_makes_of_any_value_is_accepted(value: Any) -> None:
    deep: Any = value
    for _ in range(30):  # deeper than the protocol allows: json_safe must cut it
        deep = [deep]
    details = json_safe({"value": value, "deep": deep, "long": "x" * 20_000})
    message = make_message("event", run="r", rank=0, host="h", ts=1.0, seq=0, step=1, id="0-1",
                           severity="info", kind="custom", message="m", details=details, count=1)
    decode(encode_fitted(message))


@given(st.one_of(st.floats(), st.none()), st.integers(0, 40))
def test_formatting_renders_any_number(value: float | None, width: int) -> None:
    assert len(bar(value, width)) == width
    assert number(value)
    assert duration(value)
    values = [v for v in [value, 1.0, math.inf, -math.inf, math.nan] if v is not None]
    assert len(spark(values, 0.0, 100.0, width)) == max(width, 0)


# -- the knowledge base --------------------------------------------------------------------------

markdown_lines = st.lists(
    st.one_of(
        st.sampled_from([
            "# #1 Title", "- **ID:** 4cea7bbf-3f87-4a93-8875-24fd03a8067a", "- **Number:** 1",
            "- **Number:** 99999999999999999999999", "- **Steps:** 5-2", "- **Ranks:** -1", "## Timeline",
            "## Context", "### 2026-11-28T09:21:00.000Z · tried · alice", "- **Outcome:** helped",
            "- **Step:** 12", "```json", "```", '{"a": [1, 2]}', "[[[[[[", "## Summary",
            "**Applies to:** `x`",
            "## Symptom", "## First checks", "1. look", "## Likely causes", "### cause",
            "- **Component:** data", "- **Verify:** v", "- **Mitigate:** m", "## Escalation",
            "## What to record", "> quoted", "| a | b |", "| --- | --- |",
        ]),
        st.text(alphabet=string.printable, max_size=40),
    ),
    max_size=40,
)


@given(markdown_lines)
def test_any_markdown_is_an_incident_or_a_line_numbered_problem(lines: list[str]) -> None:
    with contextlib.suppress(ParseError, UserError):
        parse_incident("\n".join(lines))


@given(markdown_lines)
def test_any_markdown_is_a_runbook_or_a_line_numbered_problem(lines: list[str]) -> None:
    with contextlib.suppress(RunbookError):
        parse_runbook("\n".join(lines), Path("fuzz.md"))


# -- the command line ----------------------------------------------------------------------------

words = st.one_of(
    st.sampled_from([
        "1", "#1", "0", "-1", "abcd", "--step", "--outcome", "helped", "--rank", "--steps", "5-2",
        "--title", "--kind", "loss spike", "--status", "open", "--limit", "-5", "--json", "--severity",
        "9" * 30, "--window", "--tag", "a,b", "--untag", "--event", "--recording", "/nonexistent",
    ]),
    st.text(alphabet=string.printable, max_size=12),
)
subcommands = st.sampled_from(
    ["new", "list", "show", "search", "add-note", "tried", "status", "edit", "tick", "similar", "runbooks",
     "where"]
)


@pytest.fixture(scope="module")
def kb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-kb")
    assert cli.main(["incidents", "new", "--title", "fuzz target", "--kb", str(folder)]) == 0
    return folder


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "120")))
@given(subcommands, st.lists(words, max_size=6))
def test_the_incidents_command_line_ends_with_a_status_never_a_traceback(
    kb_dir: Path, command: str, arguments: list[str]
) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(["incidents", command, *arguments, "--kb", str(kb_dir)])
        except SystemExit as exit_:  # argparse's usage errors
            status = int(exit_.code or 0)
    assert status in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
