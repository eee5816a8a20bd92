"""Knowledge-base benchmark: search latency, concurrent insert throughput, Markdown export time.

Builds a synthetic knowledge base (default 100,000 incidents with 1,000,000 timeline entries) in
one bulk transaction with the search indexes rebuilt once at the end, then measures:

- search: median and p95 latency of a mix of queries (words, phrases, punctuation, prefixes,
  filters), against the target of a 50 ms median; baseline: the same queries as LIKE scans
  (what you would do without FTS), measured on a few queries in the same run;
- insert: notes per second with 4 writer processes at once (each note its own BEGIN IMMEDIATE
  transaction, FTS triggers on), against 1 writer adding the same number of notes;
- export: seconds to write 10,000 incidents as Markdown, against reading the same rows and
  serialising them to JSON (the floor any export pays).

    python benchmarks/kb.py                     # full size (a few minutes on 2 cores)
    python benchmarks/kb.py --incidents 10000 --entries 100000   # quick
    python benchmarks/kb.py --kb /tmp/kb-bench  # keep (and reuse) the synthetic KB
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from publisher.wire.event_kinds import EVENT_KINDS
from tuimon.kb import IncidentFilter, KnowledgeBase, schema
from tuimon.kb import db as kbdb
from tuimon.kb.model import format_time

SEARCH_TARGET_MS = 50.0

# Vocabulary of the synthetic incidents: phrases engineers write, with numbers and names mixed in.
_SYMPTOMS = [
    "loss spiked to {x} at step {step}",
    "grad-norm jumped from {small} to {x}",
    "throughput dropped by {pct}% on {host}",
    "GPU {gpu} on {host} throttling (hw_slowdown), clocks at {mhz} MHz",
    "NCCL timeout in all_reduce after {sec}s on rank {rank}",
    "ECC uncorrected errors on {host} GPU {gpu}, Xid {xid}",
    "dataloader workers stalled, data_time {sec}s per step",
    "loss is nan after step {step} with fp16",
    "host memory growing {mb} MB per 1000 steps",
    "dead ReLU units in layer {layer}",
    "eval() mode left on after validation at step {step}",
    "replicas diverged on {param} between rank 0 and rank {rank}",
]
_TRIED = [
    "lowered the learning rate to {lr}",
    "enabled gradient clipping at {clip}",
    "switched to bf16 autocast",
    "increased num_workers to {n}",
    "restarted from checkpoint step {step}",
    "drained {host} and resumed elsewhere",
    "skipped the bad batch {batch}",
    "raised adam eps to 1e-6",
    "added model.train() after evaluation",
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "pinned dataset to local NVMe",
    "re-ran step {step} on another GPU",
]
_NOTES = [
    "checked {param} statistics, nothing unusual",
    "seen on {host} before, see runbook",
    "warm-up ends at step {step}, suspicious timing",
    "loss curve recovers after {n} steps",
    "dmesg shows Xid {xid} on {host}",
    "nvidia-smi reports power cap {watts} W",
    "batch {batch} contains empty sequences",
    "attention logits growing in layer {layer}",
    "q_proj weights norm {x}",
    "storage latency {ms} ms on the shared filesystem",
]
_TAGS = [
    "lr",
    "fp16",
    "bf16",
    "nccl",
    "dataloader",
    "hardware",
    "warmup",
    "ecc",
    "oom",
    "moe",
    "ddp",
    "eval",
    "checkpoint",
    "storage",
    "network",
    "thermal",
    "tokenizer",
    "attention",
    "optimizer",
    "regression",
]
_QUERIES = [
    "nccl timeout",
    "grad-norm",
    '"learning rate"',
    "xid",
    "throttling",
    "ecc uncorrected",
    "bf16",
    "dataloader stalled",
    "warm-up",
    "q_proj",
    "expandable_segments",
    "checkpoint",
    "nan fp16",
    "loss spiked",
    "thrott*",
    "evaluation train",
    "NVMe",
    "power cap",
    "empty sequences",
    "adam eps",
    "replicas diverged",
    "dead relu",
    "clipping",
    "attention logits",
    "node17",
    "memory growing",
    "lowered learning rate",
    '"gradient clipping"',
    "hw_slowdown",
    "shared filesystem",
]


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        x=f"{rng.uniform(2, 900):.2f}",
        small=f"{rng.uniform(0.1, 2):.2f}",
        step=rng.randrange(1, 500_000),
        pct=rng.randrange(5, 90),
        host=f"node{rng.randrange(64)}",
        gpu=rng.randrange(8),
        mhz=rng.randrange(600, 1980),
        sec=rng.randrange(1, 1800),
        rank=rng.randrange(256),
        xid=rng.choice([13, 31, 43, 48, 63, 74, 79, 94, 95]),
        mb=rng.randrange(10, 900),
        layer=rng.randrange(96),
        param=f"layers.{rng.randrange(96)}.mlp.fc{rng.randrange(1, 3)}",
        lr=rng.choice(["1e-4", "3e-4", "5e-5", "6e-4"]),
        clip=rng.choice([0.5, 1.0, 2.0]),
        n=rng.randrange(2, 32),
        batch=rng.randrange(1_000_000),
        watts=rng.randrange(250, 700),
        ms=rng.randrange(5, 900),
    )


def build(db_path: Path, incidents: int, entries: int, seed: int = 0) -> float:
    """Bulk-load synthetic incidents and entries into a migrated database; returns seconds taken.

    One transaction, with the search and label indexes rebuilt once at the end
    (:func:`tuimon.kb.schema.indexes_suspended`).
    """
    rng = random.Random(seed)
    kinds = list(EVENT_KINDS)
    base = 1_700_000_000
    started = time.perf_counter()
    db = kbdb.connect(db_path)

    def incident_rows():
        for number in range(1, incidents + 1):
            kind = kinds[number % len(kinds)]
            created = format_time_ts(base + number * 60)
            resolved = rng.random() < 0.7
            yield (
                number,
                str(uuid.UUID(int=rng.getrandbits(128))),
                f"{kind.replace('_', ' ')}: {_fill(rng.choice(_SYMPTOMS), rng)}",
                "resolved" if resolved else rng.choice(["open", "investigating", "mitigated"]),
                rng.choice(["info", "warning", "critical"]),
                f"run-{number % 500}",
                f"node{number % 64}",
                json.dumps([number % 8]),
                number * 10,
                number * 10 + 50,
                json.dumps([kind]),
                json.dumps(rng.sample(_TAGS, rng.randrange(1, 4))),
                _fill(rng.choice(_SYMPTOMS), rng),
                _fill(rng.choice(_NOTES), rng) if resolved else "",
                _fill(rng.choice(_TRIED), rng) if resolved else "",
                created,
                "alice",
                created,
                "bob",
                created if resolved else None,
                "bob" if resolved else None,
            )

    per_incident = max(1, entries // max(incidents, 1))

    def entry_rows():
        seq = 0
        for number in range(1, incidents + 1):
            for i in range(per_incident):
                seq += 1
                if seq > entries:
                    return
                when = format_time_ts(base + number * 60 + i)
                kind = rng.random()
                if kind < 0.35:
                    yield (
                        str(uuid.UUID(int=rng.getrandbits(128))),
                        number,
                        when,
                        "carol",
                        "tried",
                        _fill(rng.choice(_TRIED), rng),
                        rng.choice(["helped", "no_effect", "made_worse", "unknown"]),
                        rng.randrange(500_000),
                        None,
                    )
                else:
                    yield (
                        str(uuid.UUID(int=rng.getrandbits(128))),
                        number,
                        when,
                        "dave",
                        "note",
                        _fill(rng.choice(_NOTES + _SYMPTOMS), rng),
                        None,
                        None,
                        None,
                    )

    def load() -> None:
        with schema.indexes_suspended(db):
            db.conn.executemany(
                "INSERT INTO incidents (number, id, title, status, severity, run, host, ranks, step_first, "
                "step_last, kinds, tags, summary, root_cause, resolution, created_at, created_by, "
                "updated_at, updated_by, resolved_at, resolved_by) VALUES (" + ", ".join("?" * 21) + ")",
                incident_rows(),
            )
            db.conn.executemany(
                "INSERT INTO entries (id, incident, time, author, type, text, outcome, step, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                entry_rows(),
            )

    kbdb.write(db, load)
    db.execute("ANALYZE")
    db.close()
    return time.perf_counter() - started


def format_time_ts(ts: float) -> str:
    from datetime import UTC, datetime

    return format_time(datetime.fromtimestamp(ts, UTC))


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def bench_search(kb: KnowledgeBase, rounds: int) -> dict[str, float]:
    queries = [(q, IncidentFilter()) for q in _QUERIES] + [
        ("nccl timeout", IncidentFilter(statuses=("resolved",))),
        ("lowered learning rate", IncidentFilter(kinds=("loss_spike",))),
        ("throttling", IncidentFilter(tags=("thermal",))),
    ]
    for query, where in queries:  # warm the page cache the way a long-lived KB is
        kb.search(query, where=where)
    samples: dict[str, list[float]] = {
        query + (" +filter" if where.active else ""): [] for query, where in queries
    }
    for _ in range(rounds):
        for query, where in queries:
            started = time.perf_counter()
            hits = kb.search(query, where=where)
            samples[query + (" +filter" if where.active else "")].append(time.perf_counter() - started)
            assert hits, f"no results for {query!r}: the synthetic data should match every query"
    flat = sorted(s for values in samples.values() for s in values)
    worst = max(samples, key=lambda q: statistics.median(samples[q]))
    return {
        "median_ms": _median_ms(flat),
        "p95_ms": flat[int(0.95 * (len(flat) - 1))] * 1000,
        "worst_query": worst,
        "worst_query_median_ms": _median_ms(samples[worst]),
    }


def bench_like_baseline(db_path: Path) -> float:
    """Median ms of a LIKE scan over titles, summaries and entry texts (no index can help)."""
    db = kbdb.connect(db_path)
    times = []
    for word in ("nccl", "throttling", "xid"):
        started = time.perf_counter()
        db.execute(
            "SELECT DISTINCT incident FROM entries WHERE text LIKE ? UNION "
            "SELECT number FROM incidents WHERE title LIKE ? OR summary LIKE ? LIMIT 20",
            [f"%{word}%"] * 3,
        ).fetchall()
        times.append(time.perf_counter() - started)
    db.close()
    return _median_ms(times)


_WRITER = """
import sys, time
from pathlib import Path
from tuimon.kb import KnowledgeBase
kb = KnowledgeBase.open(sys.argv[1], author=sys.argv[2])
count, top, go = int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
while not go.exists():
    time.sleep(0.005)
for i in range(count):
    kb.add_note((i * 7919) % top + 1, f"benchmark note {i} from {sys.argv[2]}: checked grad-norm and loss")
kb.close()
"""


def bench_insert(kb_dir: Path, writers: int, notes: int, top: int) -> float:
    """Notes per second with ``writers`` processes each adding ``notes`` notes at once."""
    with tempfile.TemporaryDirectory() as scratch:
        go = Path(scratch) / "go"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(kb_dir), f"w{i}", str(notes), str(top), str(go)]
            )
            for i in range(writers)
        ]
        time.sleep(1.5)  # let every process import and open the database before the start signal
        started = time.perf_counter()
        go.touch()
        for proc in procs:
            if proc.wait() != 0:
                raise SystemExit("a writer process failed")
        return writers * notes / (time.perf_counter() - started)


def bench_export(kb: KnowledgeBase, count: int) -> tuple[float, float]:
    """(seconds to export ``count`` incidents, seconds to read and JSON-dump the same rows)."""
    numbers = list(range(1, count + 1))
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        kb.export(Path(out), numbers)
        export_s = time.perf_counter() - started
    started = time.perf_counter()
    for number in numbers:
        json.dumps(
            [
                kb.get(number).to_json(),
                [e.to_json() for e in kb.timeline(number)],
                [c.to_json() for c in kb.context(number)],
            ]
        )
    return export_s, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--incidents", type=int, default=100_000)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--kb", type=Path, help="folder for the synthetic KB (reused if it already has one)")
    parser.add_argument("--rounds", type=int, default=5, help="timed passes over the query mix")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--notes", type=int, default=250, help="notes per writer process")
    parser.add_argument("--export", type=int, default=10_000, help="incidents to export")
    args = parser.parse_args()

    scratch = None
    if args.kb is None:
        scratch = tempfile.TemporaryDirectory(prefix="tuimon-kb-bench-")
        args.kb = Path(scratch.name)
    kb = KnowledgeBase.open(args.kb, author="bench")
    try:
        existing = kb.count()
        if existing == 0:
            seconds = build(kb.location.db_path, args.incidents, args.entries)
            print(f"built {args.incidents:,} incidents, {args.entries:,} entries in {seconds:.1f} s")
        else:
            print(f"reusing {existing:,} incidents in {args.kb}")
        size_mb = kb.location.db_path.stat().st_size / 2**20
        print(f"database: {size_mb:,.0f} MiB")

        result = bench_search(kb, args.rounds)
        like_ms = bench_like_baseline(kb.location.db_path)
        verdict = "meets" if result["median_ms"] < SEARCH_TARGET_MS else "MISSES"
        print(
            f"search: median {result['median_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms "
            f"({verdict} the {SEARCH_TARGET_MS:.0f} ms target); slowest query {result['worst_query']!r} "
            f"median {result['worst_query_median_ms']:.1f} ms"
        )
        print(
            f"search baseline (LIKE scan, same run): median {like_ms:.0f} ms -> FTS is "
            f"{like_ms / result['median_ms']:.0f}x faster"
        )

        top = min(kb.count(), 1000)
        single = bench_insert(args.kb, 1, args.notes * args.writers, top)
        multi = bench_insert(args.kb, args.writers, args.notes, top)
        print(
            f"insert: {multi:.0f} notes/s with {args.writers} writer processes vs {single:.0f} notes/s "
            f"with 1 (ratio {multi / single:.2f})"
        )

        export_n = min(args.export, kb.count())
        export_s, floor_s = bench_export(kb, export_n)
        print(
            f"export: {export_n:,} incidents in {export_s:.1f} s ({export_n / export_s:.0f}/s); "
            f"reading + JSON of the same rows {floor_s:.1f} s (ratio {export_s / floor_s:.1f})"
        )
    finally:
        kb.close()
        if scratch is not None:
            scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
