"""Another thread's Python stack, read without disturbing it, cut to fit a heartbeat; and whether it
waits inside a collective.

Why from another thread: a signal handler (``faulthandler``, ``signal``) runs on the main thread
only, and only once it returns to the interpreter, which a thread blocked in C++ (a gloo or NCCL
wait, a CUDA synchronisation) never does. :func:`sys._current_frames` instead hands any thread the
topmost frame of every other one, "most useful for debugging deadlock"
(https://docs.python.org/3/library/sys.html#sys._current_frames), and
:meth:`traceback.StackSummary.extract` turns frames into (file, line, function) without reading
source files when ``lookup_lines`` is false
(https://docs.python.org/3/library/traceback.html#traceback.StackSummary.extract). The training
thread is neither stopped nor signalled: the reader only follows ``f_back`` links under the GIL.

Why "in a collective": in a job where every rank stopped, the ranks blocked in the same
collective are waiting for the one that never reached it. PyTorch's Flight Recorder finds that rank
after the fact from its record of collectives
(https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html; its TorchComms
successor also dumps each rank's Python stacks:
https://docs.pytorch.org/tutorials/intermediate/debug_hangs_with_flight_recorder.html); here each
rank says live whether its own innermost frames are in one, so a viewer can name "the rank outside
the collective the others wait in". A blocking ``dist.all_reduce`` on gloo shows as
``torch/distributed/distributed_c10d.py ... all_reduce`` (under ``c10d_logger.py ... wrapper``) as
the innermost Python frame, the wait itself being C++. In a job of several ranks, a thread whose
innermost Python frame is autograd's entry into its C++ engine (``loss.backward()``) is taken to
wait there too: DistributedDataParallel reduces gradients from autograd hooks during the backward
pass, and "when all buckets are ready, the Reducer will block waiting for all allreduce operations
to finish", inside the engine (https://docs.pytorch.org/docs/stable/notes/ddp.html, "Internal
Design"). Waits that happen elsewhere outside Python frames of ``torch.distributed`` are not
recognised: NCCL work awaited by a later CUDA synchronisation (``loss.item()``), a ``work.wait()``
on an asynchronous handle called from the user's own function.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

import orjson

from publisher.wire.validation import MAX_STACK_ENTRY_CHARS, MAX_STACK_FRAMES

#: Innermost frames kept: where a thread is stuck is at the inner end.
FRAMES = min(40, MAX_STACK_FRAMES - 1)  # one entry is left for the "outer frames left out" note
#: Characters of one "file:line function" entry (the start of a long path goes first).
ENTRY_CHARS = min(240, MAX_STACK_ENTRY_CHARS)
#: Bytes the whole stack may take as JSON: well under a heartbeat's 16 KiB, and under an event's
#: 16 KiB too when a relay quotes it in a ``hang`` event's details.
STACK_BYTES = 6_000
#: Innermost frames that decide whether the thread waits in a collective (a collective is entered
#: through a wrapper or two: ``c10d_logger``, functional collectives, ``torch._ops``).
INNER_FRAMES = 3
#: Names of collective calls (prefixes), whatever library makes them (torch, DeepSpeed, Horovod...).
_COLLECTIVE_NAMES = (
    "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "barrier",
    "monitored_barrier", "all_to_all", "alltoall", "wait_tensor",
)


#: (file ending, function) of autograd's entry into its C++ engine: ``_engine_run_backward`` since
#: torch 2.3, ``backward``/``grad`` of ``torch.autograd`` before.
_BACKWARD = (
    ("/torch/autograd/graph.py", "_engine_run_backward"),
    ("/torch/autograd/__init__.py", "backward"),
    ("/torch/autograd/__init__.py", "grad"),
)


@dataclass(frozen=True)
class Stack:
    """A thread's stack as the wire carries it: ``entries`` "file:line function", innermost last."""

    entries: tuple[str, ...]
    in_collective: bool


def capture(thread_id: int, *, in_job: bool = False) -> Stack | None:
    """The current stack of the thread ``thread_id`` (None when it has ended), from any other thread.
    ``in_job``: the process is one rank of several (a backward pass may wait for the others)."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return None
    try:
        depth = _depth(frame)
        frames = traceback.StackSummary.extract(
            traceback.walk_stack(frame), limit=FRAMES, lookup_lines=False
        )
    finally:
        del frame  # a frame keeps its locals alive: hold the training thread's no longer than needed
    frames.reverse()  # innermost last, as tracebacks print
    inner = [(summary.filename, summary.name) for summary in frames[-INNER_FRAMES:]]
    entries = [_entry(summary.filename, summary.lineno, summary.name) for summary in frames]
    return Stack(_fit(entries, depth - len(entries)), in_collective(inner, in_job=in_job))


def in_collective(inner: Sequence[tuple[str, str]], *, in_job: bool = False) -> bool:
    """Whether any of these (filename, function) frames, innermost last, is a collective call or
    torch.distributed's; with ``in_job``, also whether the innermost is autograd's C++ engine."""
    if in_job and inner:
        path, name = inner[-1][0].replace("\\", "/"), inner[-1][1]
        if any(path.endswith(end) and name == function for end, function in _BACKWARD):
            return True
    for filename, name in inner:
        path = filename.replace("\\", "/")
        lowered = name.lower()
        if "/torch/distributed/" in path or "c10d" in path.rpartition("/")[2]:
            return True
        if lowered.startswith(_COLLECTIVE_NAMES):
            return True
        if lowered == "wait" and "/torch/" in path:  # torch.futures.Future.wait, a Work's wait
            return True
    return False


def _depth(frame: FrameType) -> int:
    depth = 0
    current: FrameType | None = frame
    while current is not None:
        depth += 1
        current = current.f_back
    return depth


def _entry(filename: str, lineno: int | None, name: str) -> str:
    """``file:line function``, wire-safe (no lone surrogates from undecodable file names), cut
    from the left (the path's start says least) to :data:`ENTRY_CHARS`."""
    text = f"{filename}:{lineno} {name}".encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= ENTRY_CHARS else "…" + text[-(ENTRY_CHARS - 1):]


def _fit(entries: list[str], left_out: int) -> tuple[str, ...]:
    """Drop outer entries until the stack's JSON fits :data:`STACK_BYTES`; a first entry says how
    many outer frames are not shown."""
    sizes = [len(orjson.dumps(entry)) + 1 for entry in entries]
    total = sum(sizes)
    start = 0
    while start < len(entries) and total > STACK_BYTES - 64:
        total -= sizes[start]
        start += 1
    left_out += start
    kept = tuple(entries[start:])
    return (f"… {left_out} outer frames left out", *kept) if left_out > 0 else kept
