"""What the Monitor reads, on the training thread: a step's numbers, and who the process is.

Per step, each cheap enough for the training thread itself (the step's cost is measured by
``benchmarks/overhead.py``): the step's numbers, on the host now or set aside for the one
device-to-host copy (``step.py``), step time and data wait (``timing.py``), the step's own work
apart from its wait in the all-reduce (``compute_time.py``), memory (``memory.py``) and the wait
for a CPU (``cpu_wait.py``) at a bounded rate, batch fingerprints on the data path
(``batches.py``), and the parameters the optimizers train (``params.py``). Once, at start: which
run, rank and world this is (``identity.py``) and what reproduces it (``sysinfo.py``).

Nothing here starts a thread or patches torch: what runs beside the training is in ``threads/``,
what wraps torch functions in ``patches/``.
"""
