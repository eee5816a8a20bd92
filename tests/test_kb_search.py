"""Full-text search: ranking, punctuation, phrases, stemming, snippets, filters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tuimon.errors import UserError
from tuimon.kb import IncidentDraft, IncidentFilter, KnowledgeBase
from tuimon.kb import search as kbsearch


@pytest.fixture
def kb(tmp_path: Path) -> Iterator[KnowledgeBase]:
    with KnowledgeBase.open(tmp_path / "kb", author="alice") as opened:
        yield opened


def _numbers(kb: KnowledgeBase, query: str, **where: object) -> list[int]:
    return [hit.incident.number for hit in kb.search(query, where=IncidentFilter(**where))]


@pytest.fixture
def filled(kb: KnowledgeBase) -> KnowledgeBase:
    one = kb.open_incident(
        IncidentDraft(
            title="NCCL timeout during all_reduce", kinds=["throughput_drop"], tags=["nccl", "network"]
        )
    )
    kb.add_note(one.number, "rank 17 stopped answering; NCCL_DEBUG=INFO shows a socket fallback")
    two = kb.open_incident(IncidentDraft(title="Loss spike at step 12000", kinds=["loss_spike"]))
    kb.add_note(two.number, "the grad-norm jumped from 0.3 to 900 at the spike")
    kb.add_tried(two.number, "Lowered the learning rate to 1e-4", "helped", step=12100)
    kb.update(two.number, root_cause="warm-up ended while the learning rate was still too high")
    kb.set_status(two.number, "resolved")
    three = kb.open_incident(IncidentDraft(title="Throughput drop on node3", kinds=["gpu_throttle"]))
    kb.add_note(three.number, "GPU 2 throttled: hw_slowdown; a spike in loss followed later")
    kb.add_note(three.number, "timeout waiting for data once")
    return kb


def test_title_match_ranks_above_a_passing_mention(filled: KnowledgeBase) -> None:
    assert _numbers(filled, "timeout") == [1, 3]
    assert _numbers(filled, "throughput")[0] == 3


def test_punctuation_and_phrases(filled: KnowledgeBase) -> None:
    assert _numbers(filled, "grad-norm") == [2]
    assert _numbers(filled, "grad_norm") == [2]  # same words, other punctuation
    assert _numbers(filled, "all_reduce") == [1]
    assert _numbers(filled, "NCCL_DEBUG=INFO") == [1]
    assert _numbers(filled, "1e-4") == [2]
    assert _numbers(filled, "it's") == []  # no syntax error, just nothing found
    # A quoted phrase keeps its word order; loose words do not need it.
    assert _numbers(filled, '"loss spike"') == [2]
    assert sorted(_numbers(filled, "loss spike")) == [2, 3]
    assert _numbers(filled, '"learning rate" helped') == []  # the outcome is not text
    assert _numbers(filled, '"learning rate"') == [2]


def test_stemming_prefix_and_operators(filled: KnowledgeBase) -> None:
    assert _numbers(filled, "throttling") == [3]  # porter: throttled ~ throttling
    assert _numbers(filled, "lowering") == [2]
    assert _numbers(filled, "thrott*") == [3]
    assert sorted(_numbers(filled, "nccl OR throttled")) == [1, 3]
    assert _numbers(filled, "spike NOT throttled") == [2]
    with pytest.raises(UserError, match="put quotes around OR, AND or NOT"):
        filled.search("NOT")
    with pytest.raises(UserError, match="at least one word"):
        filled.search('  "" ')


def test_hits_say_where_they_matched_with_highlights(filled: KnowledgeBase) -> None:
    [hit] = filled.search("warm-up")
    assert hit.matched == "root_cause"
    assert hit.snippet.segments[0] == ("warm-up", True)
    assert hit.snippet.marked("<", ">") == "<warm-up> ended while the learning rate was still too high"
    [tried] = filled.search("lowered learning")
    assert (tried.matched, tried.outcome) == ("tried", "helped")
    assert tried.snippet.marked() == "[Lowered] the [learning] rate to 1e-4"
    [tag] = filled.search("network")
    assert tag.matched == "tags"
    assert tag.snippet.marked() == "nccl, [network]"
    assert all(hit.score > 0 for hit in filled.search("timeout"))


def test_filters_narrow_a_search(filled: KnowledgeBase) -> None:
    assert _numbers(filled, "spike", statuses=("resolved",)) == [2]
    assert _numbers(filled, "spike", kinds=("gpu_throttle",)) == [3]
    assert _numbers(filled, "timeout", tags=("nccl",)) == [1]
    assert _numbers(filled, "timeout", statuses=("mitigated",)) == []


def test_many_matches_rank_the_newest_and_filters_still_find_old_ones(
    kb: KnowledgeBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kbsearch, "RANK_CANDIDATES", 3)
    for n in range(1, 11):
        kind = "gpu_ecc" if n == 2 else "loss_spike"
        number = kb.open_incident(IncidentDraft(title=f"incident {n}", kinds=[kind])).number
        kb.add_note(number, "common words everywhere")
    newest = _numbers(kb, "common words")
    assert sorted(newest) == [8, 9, 10]  # only the newest 3 matching entries were ranked
    # A narrow filter would find nothing among the newest matches: it falls back to ranking them all.
    assert _numbers(kb, "common words", kinds=("gpu_ecc",)) == [2]


def test_search_sees_edits_and_new_entries(filled: KnowledgeBase) -> None:
    assert _numbers(filled, "checksum") == []
    filled.add_note(3, "the checksum of shard 7 was wrong")
    assert _numbers(filled, "checksum") == [3]
    filled.update(3, title="Bad shard checksum")
    assert filled.search("shard")[0].matched == "title"
    filled.update(3, title="Throughput drop on node3")
    assert filled.search("shard")[0].matched == "note"
