"""The benchmarks still run against the code they measure: a script that rots measures nothing
(a probe on a moved action read every key press as "nan" after a 10 s wait). No figure is judged
here; speed is the benchmarks' business."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from blocks import Steal, calm  # noqa: E402  (benchmarks/ is not a package)
from ingest import parse_rows  # noqa: E402

#: Blocks of 0.3 s (three hand-off periods) instead of a second: the scripts run through every arm
#: in a third of the time, their figures further from the truth, which is not judged here.
SHORT_BLOCKS = ("--block-s", "0.3")


def test_the_ingest_benchmark_measures_key_presses_and_the_screen() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ingest.py"), "--rates", "2000",
                           "--seconds", "1"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (row,) = parse_rows(done.stdout).values()
    assert row.absorbed > 0 and row.lost == 0
    assert math.isfinite(row.key_p95_ms) and math.isfinite(row.delay_p95_s), done.stdout


@pytest.mark.parametrize("publishers", ["judging", "older"])
def test_the_scale_benchmark_names_the_rank_outside_the_collective_and_blames_nobody_else(
    publishers: str,
) -> None:
    """`scale.py --hang` at a small scale (2 nodes x 4 ranks, real relay processes): the rank that
    stops outside the collective is named with its host within 10 s, by its own publisher when it
    judges itself, else by the root; nobody else is blamed; every rank's start reached the root."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--hang", "--nodes", "2",
                           "--ranks-per-node", "4", "--rate", "5", "--warm-up", "1", "--seconds", "9",
                           "--publishers", publishers],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    named = re.search(r"^named: rank (\d+) on (\S+) after ([\d.]+) s by (.+?):", done.stdout, flags=re.M)
    assert named is not None, done.stdout
    rank, host, seconds, by = int(named[1]), named[2], float(named[3]), named[4]
    assert (rank, host) == (6, "node1") and seconds < 10, done.stdout
    assert by == ("its own publisher" if publishers == "judging" else "the relay root@root"), done.stdout
    assert "blamed (warning or critical): rank 6 only" in done.stdout
    assert "run_starts at the root: 8 of 8" in done.stdout


def test_the_gil_share_benchmark_runs_the_same_work_in_a_thread_and_in_a_process() -> None:
    """`gil_share.py`: a row per arm, each with the background work's CPU measured (a server process
    that never started its work, or a thread that never ran, would read 0 and the comparison
    would be empty)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gil_share.py"), "--rounds", "1",
                           "--passes", "15", *SHORT_BLOCKS],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    rows = {line[:18].strip(): line for line in done.stdout.splitlines()
            if line.startswith(("thread", "process"))}
    assert set(rows) == {"thread", "thread, yielding", "process"}, done.stdout
    for arm, row in rows.items():
        background_us = float(re.findall(r"(-?[\d.]+)us", row)[2])
        assert background_us > 0, (arm, done.stdout)


def test_the_cost_split_benchmark_reads_every_background_thread() -> None:
    """`cost_split.py` on the small MLP: a row whose step() and worker/link CPU and the publisher's
    process's are measured (a thread renamed in the publisher would read 0 here, and the split
    would silently lose it), a value under every column of the header."""
    script = ROOT / "benchmarks" / "cost_split.py"
    done = subprocess.run([sys.executable, str(script), "--rounds", "2", "--models", "mlp",
                           "--steal-limit", "1", *SHORT_BLOCKS],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("model")).split()
    row = next(line for line in lines if line.startswith("MLP"))
    values = [float(v) for v in re.findall(r"(-?[\d.]+)(?:us|ms)", row)]
    timed = dict(zip([name for name in header if name not in ("model", "ratio", "rounds", "q1-q3", "calm")],
                     values, strict=True))
    assert re.search(r"\s2/2\s", row), row  # every round calm where the limit keeps them all
    assert timed["step()"] > 0 and timed["worker"] > 0 and timed["link"] > 0 and timed["process"] > 0, row


def test_the_feature_cost_benchmark_measures_every_arm_against_the_bare_loop() -> None:
    """`feature_cost.py` on the small MLP, one round: a row for the default Monitor, each feature
    left out, the base and a second bare copy (the run's A/A), each a ratio to the bare loop over
    its calm rounds, all of them here (a Monitor setting renamed would stop it at start, a broken
    arm would print no row). The ratios themselves are not judged: one
    round beside other tests is noise (an arm's two adjacent blocks read 2.16x in one CI run
    while the default Monitor's read about 1.1x)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "feature_cost.py"), "--rounds", "1",
                           "--steal-limit", "1", *SHORT_BLOCKS],
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    rows = {line[:14].strip(): line[14:].split() for line in done.stdout.splitlines()
            if line.startswith(("all", "-", "ba"))}
    assert set(rows) == {"bare again", "all", "-invariants", "-stats", "-detectors", "-grad norm", "base"}, \
        done.stdout
    for arm, (ratio, *_, calm_rounds, every_round) in rows.items():
        assert math.isfinite(float(ratio)) and float(ratio) > 0, (arm, done.stdout)
        assert calm_rounds == "1/1" and float(every_round) > 0, (arm, done.stdout)


def _stat(path: Path, user: int, idle: int, steal: int) -> None:
    """A /proc/stat as Linux writes it (proc(5)): the machine's line, then one per CPU."""
    path.write_text(f"cpu  {user} 0 50 {idle} 10 0 5 {steal} 7 0\n"
                    f"cpu0 {user} 0 50 {idle} 10 0 5 {steal} 7 0\nintr 1 2 3\nctxt 99\n")


def test_steal_is_the_share_of_the_machines_time_the_host_took_between_two_readings(tmp_path: Path) -> None:
    """A block during which the host took 40 of the machine's 200 ticks lost a fifth of its time:
    its round is left out of the ratios at the default limit, kept where every round is asked for."""
    stat = tmp_path / "stat"
    _stat(stat, user=100, idle=800, steal=35)
    steal = Steal(stat)
    _stat(stat, user=160, idle=900, steal=75)
    share = steal.share()
    assert share == pytest.approx(40 / 200)
    ratios, steals = [1.01, 1.40, 1.03], [[0.001, 0.0], [0.001, share], [None, 0.01]]
    assert calm(ratios, steals, limit=0.02) == [1.01, 1.03], "one block of a round is enough to drop it"
    assert calm(ratios, steals, limit=1.0) == ratios


def test_a_machine_whose_kernel_keeps_no_steal_counts_every_round_as_calm(tmp_path: Path) -> None:
    old_kernel = tmp_path / "stat"
    old_kernel.write_text("cpu  100 0 50 800\n")  # Linux before 2.6.11: four counters
    assert Steal(old_kernel).share() is None
    assert Steal(tmp_path / "missing").share() is None
    assert calm([1.2, 0.9], [[None, None], [None, None]], limit=0.02) == [1.2, 0.9]


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat here")
def test_this_machines_steal_reads_as_a_share() -> None:
    share = Steal().share()
    assert share is not None and 0.0 <= share <= 1.0


#: A weight whose gradient went to zero after one step (a ReLU that died): Adam's first moment decays
#: by 0.9 a step. Prints how many of its entries are subnormal after 1,000 steps, with and without
#: the benchmarks' flush, in a process of its own (the flush is the thread's for good).
ADAM_OF_A_DEAD_UNIT = """
import sys, torch
from blocks import flush_subnormals
if sys.argv[1] == "flushed":
    flush_subnormals()
weight = torch.nn.Parameter(torch.ones(64))
adam = torch.optim.Adam([weight])
for step in range(1000):
    weight.grad = torch.full_like(weight, 1e-3 if step == 0 else 0.0)
    adam.step()
moment = adam.state[weight]["exp_avg"]
print(int(((moment != 0) & (moment.abs() < torch.finfo(moment.dtype).tiny)).sum()))
"""


@pytest.mark.parametrize(("arm", "subnormals"), [("as torch leaves it", 64), ("flushed", 0)])
def test_a_dead_units_adam_moment_stays_subnormal_unless_the_benchmark_flushes_it(
        arm: str, subnormals: int) -> None:
    """Where it stays, x86 computes the step's updates in microcode: the ~10 ms MLP's step doubled as
    it converged, and the arm that had trained longer read slower (docs/benchmarks.md)."""
    result = subprocess.run([sys.executable, "-c", ADAM_OF_A_DEAD_UNIT, arm], cwd=ROOT / "benchmarks",
                            capture_output=True, text=True, timeout=60, check=True)
    assert int(result.stdout) == subnormals


def test_the_optimizer_hooks_benchmark_takes_the_monitors_hooks_off_and_puts_them_back() -> None:
    """`optimizer_hooks.py` on the small MLP, two rounds: the Monitor's hooks are found on the
    optimizer (one pre- and one post-hook, shared by its parts) and both arms are timed (a Monitor
    that stopped registering them, or an arm that never ran, would show here)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "optimizer_hooks.py"), "--rounds", "2",
                           "--models", "mlp", *SHORT_BLOCKS],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("MLP"))
    hooks = int(row[18:24])
    on_opt, off_opt, _, on_call, off_call = (float(v) for v in re.findall(r"(-?[\d.]+)us", row))
    assert hooks == 2, row
    assert on_opt > 0 and off_opt > 0 and on_call > 0 and off_call > 0, row


def test_the_step_floor_benchmark_times_every_arm_of_step() -> None:
    """`step_floor.py` on the small MLP, one short round: every arm, the one passing extras
    included, prints a positive median."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_floor.py"), "--steps", "30",
                           "--rounds", "1", "--models", "mlp"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("mlp")).split()
    medians = [float(value) for value in row[1:]]
    assert len(medians) == 7 and min(medians) > 0, row  # five arms, two ratios
