"""The threads tuimon starts inside a training process, each limited to one OpenMP thread.

PyTorch runs the parallel part of a CPU operation on OpenMP (GNU libgomp in the PyPI wheels), and
OpenMP keeps one pool of worker threads for each thread that starts a parallel region. libgomp
lets its pool threads spin between two regions only while the threads it manages do not outnumber
the CPUs; past that it throttles the spin, its threads sleep between regions, and every parallel
region of the training thread pays for waking them (``GOMP_SPINCOUNT``, in the libgomp manual's
"Implementation-specific environment variables"). One torch reduction over a big enough tensor
(more than ``at::internal::GRAIN_SIZE``, 32,768 values) on a thread of tuimon's adds a second pool
for the rest of the run: an unmodified nanoGPT on two CPU threads then ran 1.3-1.9x slower
(``docs/benchmarks.md``, "Real training at its real thread count").

So every thread tuimon starts in the training process sets its own OpenMP thread count to one
before it runs anything: torch then runs every operation of that thread inline
(``at::parallel_for`` goes parallel only when ``at::get_num_threads()`` of the calling thread is
above one) and no pool is ever made for it. ``torch.set_num_threads(1)`` cannot be used for it:
beside the calling thread's OpenMP setting it changes the process-wide default that new threads
take and the size of the shared pthreadpool that XNNPACK and NNPACK use for the training thread
too. ``omp_set_num_threads`` changes only the calling thread's own setting (OpenMP 4.5, section
3.2.1: it sets the *nthreads-var* of the current task). torch resets that setting when a thread
first asks for its thread count (``at::internal::lazy_init_num_threads``), so it is asked first.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: File names of the OpenMP runtimes torch is built with: GNU (Linux wheels), Intel (conda, MKL),
#: LLVM (macOS wheels).
_RUNTIMES = ("libgomp", "libiomp5", "libomp")


def daemon_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread (not started) that runs ``target`` with one OpenMP thread
    (:func:`one_openmp_thread`)."""

    def run() -> None:
        one_openmp_thread()
        target()

    return threading.Thread(target=run, name=name, daemon=True)


def one_openmp_thread() -> bool:
    """Make torch run the calling thread's CPU operations on this thread alone; False where it
    cannot be done (no OpenMP runtime found: torch then has no OpenMP pool to add either)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False  # a process without torch has no pool to add
    set_threads = _omp_set_num_threads()
    if set_threads is None:
        return False
    torch.get_num_threads()  # torch's first look on this thread sets its OpenMP count: before ours
    set_threads(1)
    return True


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime torch loaded, None if none is found (said once)."""
    for path in _loaded_runtimes():
        try:
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    try:
        return ctypes.CDLL(None).omp_set_num_threads
    except (OSError, AttributeError):
        log.info("tuimon: no OpenMP runtime found in this process; its threads keep torch's thread count")
        return None


def _loaded_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (Linux), torch's own first."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if ".so" in line}
    except OSError:
        return []
    found = [p for p in paths if os.path.basename(p).startswith(_RUNTIMES)]
    torch = sys.modules.get("torch")
    home = os.path.dirname(os.path.dirname(torch.__file__ or "")) if torch is not None else "\0"
    return sorted(found, key=lambda p: (not p.startswith(home), p))
