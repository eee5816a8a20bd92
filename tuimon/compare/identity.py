"""What differs between two runs' identities: the command, the config, the seeds, the versions, the
code, the environment and the hardware, as their ``run_start`` and GPU readings say
(docs/protocol.md; ``publisher/readings/sysinfo.py`` reads them in the training process).

What always differs between two runs and says nothing about them is left out, and the report says
so (:data:`IGNORED`): process ids, timestamps, run names, ports, and the generated names of
temporary folders. A command line is compared option by option (``--lr 0.1`` against ``--lr
0.02`` is one difference named ``--lr``), a config key by key (``optim.lr``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuimon.compare.record import RunRecord

#: What is never compared, in words, as the report states it: process ids (``pid``, ``pid1234`` in
#: names), timestamps, run names (the envelope's, and ``--run``, ``--run-name``, ``--run-id``
#: options or config keys), ports (``HOST:PORT`` in addresses, ``--port``, ``--*-port`` options
#: or config keys) and the generated names of temporary folders (``tmpXXXXXXXX``, ``pytest-N``).
IGNORED = ("process ids", "timestamps", "run names", "ports", "temporary folder names")

#: Option and config names (lower case, '-' as '_', without leading dashes) whose values are the run's
#: own name or a port: they differ between any two runs.
_IGNORED_NAMES = frozenset({"run", "run_name", "run_id", "port"})
_TEMP_PART = re.compile(r"(?<=/)(?:tmp[A-Za-z0-9_]{6,}|pytest-\d+)(?=/|$)")
_ADDRESS_PORT = re.compile(r"((?:\b[a-z][a-z0-9+.-]*://)[^\s/:@]+|\blocalhost|\b\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]):\d{1,5}\b")
_PID = re.compile(r"\bpid([._-]?)\d+")


@dataclass(frozen=True)
class Difference:
    """One thing that differs: its ``section`` (``command``, ``config``, ``monitoring`` (the Monitor's
    own options: ``--on-nonfinite``, the budgets), ``seeds``, ``versions``,
    ``code``, ``environment``, ``hardware``, ``run``), its name there, and each run's value
    (None: the run does not say)."""

    section: str
    name: str
    a: Any
    b: Any


def normalise(value: Any) -> Any:
    """``value`` with what differs between any two runs masked (see :data:`IGNORED`)."""
    if isinstance(value, str):
        value = _TEMP_PART.sub("<tmp>", value)
        value = _ADDRESS_PORT.sub(r"\1:<port>", value)
        return _PID.sub(r"pid\1<n>", value)
    if isinstance(value, list):
        return [normalise(item) for item in value]
    if isinstance(value, dict):
        return {key: normalise(item) for key, item in value.items() if not _ignored_name(key)}
    return value


def _ignored_name(name: str) -> bool:
    key = name.lstrip("-").lower().replace("-", "_")
    return key in _IGNORED_NAMES or key.endswith("_port")


def options(argv: Sequence[str]) -> dict[str, Any]:
    """A command line as named values: ``script`` (argv[0]), each ``--option`` with its value
    (``--k v``, ``--k=v``; True for a flag), positional arguments as ``arg 1``, ``arg 2``... A
    repeated option keeps its values in a list."""
    named: dict[str, Any] = {}
    if argv:
        named["script"] = argv[0]
    position = 0
    i = 1
    while i < len(argv):
        token = argv[i]
        if token.startswith("-") and not _number(token) and token != "-":
            name, equals, value = token.partition("=")
            found: Any = value if equals else True
            if not equals and i + 1 < len(argv) and (not argv[i + 1].startswith("-") or _number(argv[i + 1])):
                found = argv[i + 1]
                i += 1
            if name in named:
                previous = named[name]
                named[name] = [*previous, found] if isinstance(previous, list) else [previous, found]
            else:
                named[name] = found
        else:
            position += 1
            named[f"arg {position}"] = token
        i += 1
    return named


def _number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``{"optim": {"lr": 1}}`` is ``optim.lr``)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _compare(section: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[Difference]:
    """Each name whose value differs between ``a`` and ``b`` (normalised; a name one lacks is None)."""
    for name in [*a, *(key for key in b if key not in a)]:
        if _ignored_name(name.rpartition(".")[2]):
            continue
        value_a, value_b = normalise(a.get(name)), normalise(b.get(name))
        if value_a != value_b:
            yield Difference(section, name, value_a, value_b)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sections(record: RunRecord) -> dict[str, dict[str, Any]]:
    """Each section's named values for one run."""
    start = _mapping(record.start)
    repro = _mapping(start.get("repro"))
    git = _mapping(repro.get("git"))
    model = _mapping(start.get("model"))
    argv = start.get("argv")
    gpus = {
        f"GPU {index}": f"{device.get('name') or '?'}, {_gib(device.get('mem_total'))}"
        for index, device in sorted(record.gpus.items())
    }
    return {
        "command": options(argv) if isinstance(argv, list) else {},
        "config": flatten(_mapping(start.get("config"))),
        "monitoring": flatten(_mapping(start.get("monitoring"))),
        "seeds": {"seed": start.get("seed"), "torch_seed": repro.get("torch_seed")},
        "versions": dict(_mapping(start.get("versions"))),
        "code": {
            "git commit": git.get("commit"),
            "git dirty": git.get("dirty"),
            **{f"model {key}": value for key, value in model.items()},
        },
        "environment": {
            "host": start.get("host"),
            "cwd": start.get("cwd"),
            "python executable": repro.get("executable"),
            "world size": start.get("world_size"),
            **{f"determinism {key}": value for key, value in _mapping(repro.get("determinism")).items()},
        },
        "hardware": {"GPU source": start.get("gpu_source"), "GPUs": len(record.gpus) or None, **gpus},
    }


def _gib(value: Any) -> str:
    return f"{value / 2**30:.0f} GiB" if isinstance(value, int | float) and value > 0 else "? GiB"


def identity_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """Every difference between the identities of ``a`` and ``b``, by section."""
    if a.start is None or b.start is None:
        return []
    sections_a, sections_b = _sections(a), _sections(b)
    return [found for section, named in sections_a.items()
            for found in _compare(section, named, sections_b[section])]
