"""Replica consistency across real data-parallel processes (DDP over gloo, on the CPU).

Every 2-process script in tests/faults/ runs in one pair of processes (started once, the cases one
after the other), then the divergence cases again without telling the checker the model
(zero-code mode), and one case with three processes, where the odd rank can be named.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parent / "faults"
sys.path.insert(0, str(FAULTS))

import _harness as h  # noqa: E402

DDP_CASES = sorted(name for name in (p.stem for p in FAULTS.glob("*.py"))
                   if not name.startswith("_") and importlib.import_module(name).CASE.world_size == 2)


@pytest.fixture(scope="module")
def two_processes() -> dict[str, list[h.Recording]]:
    return h.run_distributed(DDP_CASES, world_size=2)


def test_the_suite_has_the_distributed_cases() -> None:
    assert {"healthy_ddp", "fault_ddp_raw_forward", "fault_ddp_recast", "fault_ddp_clip_one_rank",
            "fault_ddp_corrupt_allreduce"} <= set(DDP_CASES)


@pytest.mark.parametrize("name", DDP_CASES)
def test_distributed_case(two_processes, name: str) -> None:
    case = importlib.import_module(name).CASE
    recordings = two_processes[name]
    verdict = h.judge(case, recordings)
    assert verdict.passed, verdict.problems
    final = [h.final_statuses(r)["replicas_consistent"]["status"] for r in recordings]
    diverged = "replica_divergence" in case.expect
    assert final == (["violated", "violated"] if diverged else ["ok", "ok"])


def test_divergence_event_comes_from_the_lowest_rank_and_names_both(two_processes) -> None:
    rank0, rank1 = two_processes["fault_ddp_clip_one_rank"]
    [event] = rank0.events("replica_divergence")
    assert not rank1.events("replica_divergence")  # one event per run, not one per rank
    assert event["details"]["ranks"] == [0, 1]
    assert event["details"]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert event["details"]["max_relative_difference"] > 1e-6


def test_healthy_ddp_really_compared_the_replicas(two_processes) -> None:
    for recording in two_processes["healthy_ddp"]:
        [ok] = [m for m in recording.statuses("replicas_consistent") if m["status"] == "ok"]
        assert "identical across 2 ranks" in ok["message"]


def test_divergence_is_found_without_being_given_the_model() -> None:
    names = ["healthy_ddp", "fault_ddp_raw_forward", "fault_ddp_corrupt_allreduce"]
    results = h.run_distributed(names, world_size=2, model_known=False)
    for name in names:
        verdict = h.judge(importlib.import_module(name).CASE, results[name])
        assert verdict.passed, (name, verdict.problems)


def test_three_ranks_name_the_odd_one_out() -> None:
    [rank0, _, _] = h.run_distributed(["fault_ddp_clip_one_rank"], world_size=3)["fault_ddp_clip_one_rank"]
    [event] = rank0.events("replica_divergence")
    assert event["details"]["ranks"] == [0]  # only rank 0 clips its gradients
    assert "rank(s) [0] differ from the others" in event["message"]
