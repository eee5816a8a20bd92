"""The long profile of the generative test of whole training loops (``tests/test_generated_loops.py``).

    python benchmarks/generated_loops.py [--examples N] [--seed N]

``make test`` runs a bounded, seeded profile (8 loops); this runs many more (400 by default, about
a minute each hundred here) with a new seed each time unless one is given, and prints Hypothesis's
statistics and, for a failure, the shrunk loop: add it to the test module as a plain regression
test (a ``LoopRecipe`` spelt out) once it is fixed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=400, help="loops to build and run (default 400)")
    parser.add_argument("--seed", type=int, help="Hypothesis's seed (default: a new one)")
    args = parser.parse_args()
    if args.examples < 1:
        parser.error("--examples must be at least 1")
    env = {**os.environ, "TUIMON_LOOPS_PROFILE": "long", "TUIMON_LOOPS_EXAMPLES": str(args.examples),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
               "tests/test_generated_loops.py", "-k", "generated_loop_loses"]
    if args.seed is not None:
        command.append(f"--hypothesis-seed={args.seed}")
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
