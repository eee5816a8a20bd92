"""The benchmarks still run against the code they measure: a script that rots measures nothing
(a probe on a moved action read every key press as "nan" after a 10 s wait). No figure is judged
here; speed is the benchmarks' business."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ingest import parse_rows  # noqa: E402  (benchmarks/ is not a package)


def test_the_ingest_benchmark_measures_key_presses_and_the_screen() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ingest.py"), "--rates", "2000",
                           "--seconds", "1"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (row,) = parse_rows(done.stdout).values()
    assert row.absorbed > 0 and row.lost == 0
    assert math.isfinite(row.key_p95_ms) and math.isfinite(row.delay_p95_s), done.stdout
