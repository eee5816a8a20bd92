"""What the Monitor reads: a step's numbers, and who the process is.

Per step, on the training thread, only what cannot wait (its cost is measured by
``benchmarks/overhead.py`` and ``benchmarks/cost_split.py``): the step's numbers, on the host now
or set aside for the one device-to-host copy (``step.py``), the step's end and data wait
(``timing.py``), the marks of the step's own work apart from its wait in the all-reduce
(``compute_time.py``), batch fingerprints on the data path (``batches.py``), and the parameters
the optimizers train (``params.py``). The step worker (``publisher/completion.py``) turns those
into metrics and reads, at a bounded rate, memory (``memory.py``) and the training thread's wait
for a CPU (``cpu_wait.py``). Once, at start: which
run, rank and world this is (``identity.py``) and what reproduces it (``sysinfo.py``).

Nothing here starts a thread or patches torch: what runs beside the training is in ``threads/``,
what wraps torch functions in ``patches/``.
"""
