"""Incidents through the API a dashboard screen calls: open (blank or from an event), timeline,
status, edits, filters, runbook ticks, "seen before", and opening from a run's recording."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from publisher.wire.protocol import encode, make_message
from tuimon.errors import UserError
from tuimon.kb import IncidentDraft, IncidentFilter, KnowledgeBase, incidents
from tuimon.sink import Batch
from tuimon.store import Store


@pytest.fixture
def kb(tmp_path: Path) -> Iterator[KnowledgeBase]:
    with KnowledgeBase.open(tmp_path / "kb", author="alice") as opened:
        yield opened


def _event(
    step: int = 1200, kind: str = "loss_spike", event_id: str = "0-3", rank: int = 0, **extra: Any
) -> dict:
    return make_message(
        "event",
        run="gpt-small",
        rank=rank,
        host="node7",
        ts=1_700_000_000.25,
        seq=42,
        step=step,
        id=event_id,
        severity="warning",
        kind=kind,
        message=f"loss 5.1 is 2.3x its recent mean ({kind})",
        details={"loss": 5.1, "mean": 2.2},
        count=1,
        **extra,
    )


def _run_start() -> dict:
    return make_message(
        "run_start",
        run="gpt-small",
        rank=0,
        host="node7",
        ts=1_699_999_000.0,
        seq=0,
        config={"lr": 3e-4, "batch": 64},
        seed=1234,
        argv=["train.py", "--lr", "3e-4"],
        cwd="/src",
        pid=99,
        world_size=8,
        versions={"python": "3.11.7", "torch": "2.13.0"},
        gpu_source="nvml",
        repro={"git": {"commit": "abc123", "dirty": False}, "config_hash": "f00d", "seed": 1234},
    )


def test_blank_incident_and_every_kind_of_reference(kb: KnowledgeBase) -> None:
    first = kb.open_incident(IncidentDraft(title="  Loss   spike\n on node7 ", tags=["lr, warmup", "lr"]))
    second = kb.open_incident(IncidentDraft(title="second"))
    assert (first.number, second.number) == (1, 2)
    assert first.title == "Loss spike on node7"
    assert first.tags == ("lr", "warmup")
    assert first.status == "open" and first.created_by == "alice"
    assert first.created_at.endswith("Z") and "T" in first.created_at
    for ref in (1, "1", "#1", first.id, first.id[:8], first.id.upper()):
        assert kb.get(ref).id == first.id
    with pytest.raises(UserError, match="no incident #9"):
        kb.get(9)
    with pytest.raises(UserError, match="no incident with an id starting"):
        kb.get("ffffffff-0000")
    with pytest.raises(UserError, match="4 or more"):
        kb.get("ab")
    with pytest.raises(UserError, match="needs a title"):
        kb.open_incident(IncidentDraft(title="   "))


def test_a_uuid_prefix_of_digits_only_still_finds_its_incident(kb: KnowledgeBase) -> None:
    """UUIDs are hex: about one 8-character prefix in 40 is all digits, and reads like a number."""
    template = kb.open_incident(IncidentDraft(title="template"))
    incidents.merge(kb._db, dataclasses.replace(template, id="64716741-0000-4000-8000-000000000001"), (), ())
    assert kb.get("64716741").number == 2
    assert kb.get("1").number == 1  # a number that exists is still a number
    with pytest.raises(UserError, match="no incident #99999, nor one whose id starts"):
        kb.get("99999")
    with pytest.raises(UserError, match="no incident #64716741"):
        kb.get("#64716741")  # '#' always means a number


def test_ambiguous_uuid_prefix_is_refused(kb: KnowledgeBase) -> None:
    template = kb.open_incident(IncidentDraft(title="template"))
    for uid in ("abcd0000-0000-4000-8000-000000000001", "abcd0000-0000-4000-8000-000000000002"):
        incidents.merge(kb._db, dataclasses.replace(template, id=uid), (), ())  # an import with these ids
    with pytest.raises(UserError, match="matches several incidents"):
        kb.get("abcd0000")
    assert kb.get("abcd0000-0000-4000-8000-000000000002").number == 3
    assert kb.get("ABCD0000-0000-4000-8000-000000000001").number == 2  # case-insensitive


def test_open_from_event_captures_the_evidence(kb: KnowledgeBase) -> None:
    steps = list(range(1000, 1400))
    metrics = {  # the shape of the viewer's Store.metric_window: name -> (steps, values)
        "loss": (steps, [5.1 if step == 1200 else 2.2 for step in steps]),
        "grad_norm": (steps, [math.nan if step == 1201 else 0.5 for step in steps]),
    }
    devices = [
        {"index": 0, "name": "H100", "util": 98, "temp_c": 71, "throttle": [], "rank": 0, "host": "node7"},
        {
            "index": 0,
            "name": "H100",
            "util": 99,
            "temp_c": 72,
            "throttle": ["sw_thermal"],
            "rank": 0,
            "host": "node7",
        },
    ]
    incident = kb.open_from_event(
        _event(), run_start=_run_start(), metrics=metrics, gpu_devices=devices, window=20
    )
    assert incident.kinds == ("loss_spike",)
    assert (incident.run, incident.host, incident.ranks) == ("gpt-small", "node7", (0,))
    assert (incident.step_first, incident.step_last) == (1200, 1200)
    assert incident.severity == "warning"
    assert incident.title == "loss_spike at step 1200, run gpt-small", "short: kind, step, run"
    [entry] = kb.timeline(incident.number)
    assert entry.text.startswith("loss 5.1"), "the message is in the timeline"
    assert entry.type == "event" and entry.data["details"] == {"loss": 5.1, "mean": 2.2}
    assert entry.time == "2023-11-14T22:13:20.250Z"  # when the event fired, not when it was attached
    context = {record.kind: record.data for record in kb.context(incident.number)}
    window = context["metrics"]
    assert window["steps"] == list(range(1180, 1221))
    assert set(window["series"]) == {"loss", "grad_norm"}
    assert window["series"]["loss"][20] == 5.1
    assert window["series"]["grad_norm"][21] == "nan"  # a NaN stays visible, in the protocol's spelling
    assert context["gpu"]["devices"] == [devices[1]]  # the latest state of each GPU
    repro = context["reproduction"]
    assert repro["seed"] == 1234 and repro["config"] == {"lr": 3e-4, "batch": 64}
    assert (repro["git_commit"], repro["config_hash"]) == ("abc123", "f00d")
    assert repro["versions"]["torch"] == "2.13.0"


def test_open_from_the_viewers_store(kb: KnowledgeBase) -> None:
    """The path the dashboard's incident screen takes: records and windows from the real Store."""
    store = Store()
    messages = [_run_start()]
    for step in range(1150, 1250):
        loss = "nan" if step == 1200 else 2.0
        messages.append(
            make_message(
                "metrics",
                run="gpt-small",
                rank=0,
                host="node7",
                ts=1_700_000_000.0 + step,
                seq=step,
                step=step,
                metrics={"loss": loss, "lr": 3e-4},
            )
        )
    messages.append(
        make_message(
            "gpu",
            run="gpt-small",
            rank=0,
            host="node7",
            ts=1_700_000_100.0,
            seq=2000,
            simulated=True,
            devices=[{"index": 0, "util": 97, "temp_c": 80, "throttle": ["sw_thermal"]}],
        )
    )
    messages.append(_event(kind="nonfinite_loss"))
    store.deliver(Batch(messages))
    record = store.event("gpt-small", "0-3")
    view = store.run_view("gpt-small")
    incident = kb.open_from_event(
        record,
        run="gpt-small",
        host=view.hosts[0],
        run_start=view.run_start,
        metrics=store.metric_window("gpt-small", record.step, before=10, after=10),
        gpu_devices=store.devices("gpt-small"),
        window=10,
    )
    assert (incident.run, incident.host, incident.kinds) == ("gpt-small", "node7", ("nonfinite_loss",))
    context = {record.kind: record.data for record in kb.context(incident.number)}
    assert context["metrics"]["steps"] == list(range(1190, 1211))
    assert context["metrics"]["series"]["loss"][10] == "nan"
    assert context["gpu"]["devices"][0]["throttle"] == ["sw_thermal"]
    assert context["gpu"]["devices"][0]["rank"] == 0
    assert context["reproduction"]["git_commit"] == "abc123"
    [entry] = kb.timeline(incident.number)
    assert entry.data["run"] == "gpt-small" and entry.data["kind"] == "nonfinite_loss"
    # Attaching the same record again (as the screen might) adds nothing.
    assert kb.attach_events(incident.number, [record], run="gpt-small") == []


def test_attach_more_events_grows_the_incident(kb: KnowledgeBase) -> None:
    incident = kb.open_from_event(_event())
    added = kb.attach_events(
        incident.number,
        [_event(), _event(step=1500, kind="grad_explosion", event_id="2-9", rank=2)],
        metrics={"loss": ([1500], [9.0])},
    )
    assert [entry.data["id"] for entry in added] == ["2-9"]  # the first one was attached already
    grown = kb.get(incident.number)
    assert grown.kinds == ("loss_spike", "grad_explosion")
    assert grown.ranks == (0, 2)
    assert (grown.step_first, grown.step_last) == (1200, 1500)
    assert [record.kind for record in kb.context(incident.number)] == ["metrics"]


def test_timeline_entries_tried_outcomes_and_status(kb: KnowledgeBase) -> None:
    number = kb.open_incident(IncidentDraft(title="t")).number
    kb.add_note(number, "first look:\r\n  grad norm fine  \n")
    kb.add_tried(number, "Lowered the LR to 1e-4", "no-effect", step=1300)
    kb.add_tried(number, "Skipped batch 77", "Helped")
    kb.add_result(number, "loss back to 2.1 after 300 steps")
    with pytest.raises(UserError, match="unknown outcome 'sort of'"):
        kb.add_tried(number, "x", "sort of")
    with pytest.raises(UserError, match="needs some text"):
        kb.add_note(number, "  \n ")
    assert kb.set_status(number, "investigating") is not None
    assert kb.set_status(number, "INVESTIGATING") is None  # already: no entry
    resolved = kb.set_status(number, "resolved", note="fixed by skipping the batch")
    incident = kb.get(number)
    assert incident.status == "resolved" and incident.resolved_by == "alice"
    assert incident.resolved_at == resolved.time
    kb.set_status(number, "investigating")  # reopened
    assert kb.get(number).resolved_at is None
    entries = kb.timeline(number)
    assert [e.type for e in entries] == [
        "note",
        "tried",
        "tried",
        "result",
        "status_change",
        "status_change",
        "status_change",
    ]
    assert entries[0].text == "first look:\n  grad norm fine"
    assert (entries[1].outcome, entries[1].step) == ("no_effect", 1300)
    assert entries[2].outcome == "helped"
    assert entries[5].data == {"from": "investigating", "to": "resolved"}
    assert entries[5].text == "fixed by skipping the batch"
    with pytest.raises(UserError, match="unknown status"):
        kb.set_status(number, "done")


def test_update_fields_and_tags(kb: KnowledgeBase) -> None:
    number = kb.open_incident(IncidentDraft(title="t", tags=["a", "b"])).number
    before = kb.get(number)
    updated = kb.update(
        number,
        root_cause="warm-up too short\n\nsee #12",
        severity="critical",
        add_tags=["c"],
        remove_tags=["a"],
    )
    assert updated.root_cause == "warm-up too short\n\nsee #12"
    assert updated.severity == "critical"
    assert updated.tags == ("b", "c")
    assert updated.updated_at >= before.updated_at
    with pytest.raises(UserError, match="cannot be edited"):
        kb.update(number, status="resolved")
    with pytest.raises(UserError, match="may hold only"):
        kb.update(number, add_tags=["two words"])


def test_list_filters(kb: KnowledgeBase) -> None:
    kb.open_incident(IncidentDraft(title="a", kinds=["loss_spike"], tags=["lr"], run="r1"))
    b = kb.open_incident(IncidentDraft(title="b", kinds=["gpu_ecc"], tags=["hardware"], run="r2"))
    c = kb.open_incident(IncidentDraft(title="c", kinds=["loss_spike", "grad_explosion"], run="r2"))
    kb.set_status(b.number, "resolved")
    kb.add_note(c.number, "most recent activity")

    def titles(**where: Any) -> list[str]:
        return [incident.title for incident in kb.list_incidents(IncidentFilter(**where))]

    assert titles() == ["c", "b", "a"]  # most recently active first
    assert titles(kinds=("loss_spike",)) == ["c", "a"]
    assert titles(kinds=("gpu_ecc", "grad_explosion")) == ["c", "b"]
    assert titles(tags=("hardware",)) == ["b"]
    assert titles(statuses=("resolved",)) == ["b"]
    assert titles(statuses=("open",), run="r2") == ["c"]
    assert titles(since="2000-01-01T00:00:00.000Z", until="2000-01-02T00:00:00.000Z") == []
    assert kb.count(IncidentFilter(run="r2")) == 2
    # Tag edits keep the kind/tag index in step.
    kb.update(b.number, remove_tags=["hardware"], add_tags=["ecc"])
    assert titles(tags=("hardware",)) == []
    assert titles(tags=("ecc",)) == ["b"]


def test_seen_before_offers_what_helped_first(kb: KnowledgeBase) -> None:
    for n, (resolved, tried) in enumerate(
        [
            (True, [("Lowered the learning rate to 1e-4.", "helped"), ("restarted the run", "no_effect")]),
            (True, [("lowered the learning rate to 1e-4", "helped")]),
            (False, [("restarted the run", "no_effect"), ("doubled the batch", "made_worse")]),
        ]
    ):
        number = kb.open_incident(IncidentDraft(title=f"spike {n}", kinds=["loss_spike"])).number
        for text, outcome in tried:
            kb.add_tried(number, text, outcome)
        if resolved:
            kb.set_status(number, "resolved")
    kb.open_incident(IncidentDraft(title="other", kinds=["gpu_ecc"]))
    current = kb.open_incident(IncidentDraft(title="now", kinds=["loss_spike"]))
    seen = kb.seen_before(current.kinds, exclude=current.number)
    assert (seen.total, seen.resolved) == (3, 2)
    assert [incident.status for incident in seen.incidents] == ["resolved", "resolved", "open"]
    assert [(r.outcome, r.times) for r in seen.remedies] == [
        ("helped", 2),
        ("no_effect", 2),
        ("made_worse", 1),
    ]
    assert seen.remedies[0].incidents == (1, 2)
    assert (
        seen.headline()
        == "seen before: 3 incidents, 2 resolved; helped: Lowered the learning rate to 1e-4 (2x)"
    )
    assert kb.seen_before(["nonfinite_param"]).headline() == "not seen before"


def test_runbook_steps_are_ticked_on_the_timeline(kb: KnowledgeBase) -> None:
    number = kb.open_incident(IncidentDraft(title="t", kinds=["loss_spike"])).number
    [state] = kb.progress(number)
    assert state.runbook.name == "loss_spike" and state.done == 0
    kb.tick_step(number, "loss_spike", "check-1")
    kb.tick_step(number, "loss_spike", "cause-2-verify")
    kb.tick_step(number, "loss_spike", "check-1", checked=False)
    [state] = kb.progress(number)
    assert [s.step.id for s in state.steps if s.checked] == ["cause-2-verify"]
    ticks = [e for e in kb.timeline(number) if e.type == "runbook_step"]
    assert len(ticks) == 3 and ticks[1].data["text"].startswith("Verify:")
    assert ticks[1].author == "alice"
    with pytest.raises(UserError, match="has no step 'check-99'"):
        kb.tick_step(number, "loss_spike", "check-99")
    with pytest.raises(UserError, match="no runbook 'nope'"):
        kb.tick_step(number, "nope", "check-1")


def test_open_from_a_recording(kb: KnowledgeBase, tmp_path: Path) -> None:
    recording = tmp_path / "run.jsonl"
    lines = [encode(_run_start())]
    for step in range(1100, 1300):
        lines.append(
            encode(
                make_message(
                    "metrics",
                    run="gpt-small",
                    rank=0,
                    host="node7",
                    ts=1_700_000_000 + step,
                    seq=step,
                    step=step,
                    metrics={"loss": 2.0, "lr": 3e-4},
                )
            )
        )
    lines.append(b"{not json")
    lines.append(
        encode(
            make_message(
                "gpu",
                run="gpt-small",
                rank=0,
                host="node7",
                ts=1_700_000_000.0,
                seq=5000,
                simulated=True,
                devices=[{"index": 0, "util": 90}],
            )
        )
    )
    lines.append(encode(_event()))
    recording.write_bytes(b"\n".join(lines) + b"\n")
    incident = kb.open_from_recording(recording, "0-3", window=10)
    context = {record.kind: record.data for record in kb.context(incident.number)}
    assert context["metrics"]["steps"] == list(range(1190, 1211))
    assert context["gpu"]["devices"] == [{"index": 0, "util": 90, "rank": 0, "host": "node7"}]
    assert context["reproduction"]["git_commit"] == "abc123"
    with pytest.raises(UserError, match=r"no event '9-9' in .*run\.jsonl \(ids in it: 0-3\)"):
        kb.open_from_recording(recording, "9-9")
