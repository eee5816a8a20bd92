"""Turn arbitrary user values (configs, event details) into the JSON the wire protocol allows.

The publisher's sender thread encodes with ``allow_nan=False`` and refuses anything that is not
plain JSON, and readers refuse free-form objects beyond the protocol's bounds
(:mod:`publisher.wire.validation`). So values that come from users (a config holding a ``Path``,
a tuple, a numpy scalar or a tensor; event details holding a NaN, a huge list, a cycle) are
converted once, on the way in, here, and made to fit: a run's own messages are never refused.
What has no JSON form becomes its ``repr``; what is beyond a bound is cut, visibly (a string ends
with ``…``, a container's last item says how many were left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from publisher.wire.protocol import wire_number
from publisher.wire.validation import MAX_DEPTH, MAX_NAME_CHARS, MAX_NODES, MAX_TEXT_CHARS

#: What an integer beyond 64 bits becomes (JSON readers such as orjson refuse it as an integer).
_INT_RANGE = 2**63


def json_safe(value: Any) -> Any:
    """A JSON-safe copy of ``value``, within the protocol's bounds for free-form objects.

    Dicts get string keys, sequences become lists, non-finite floats the protocol's
    ``"nan"``/``"inf"`` strings, numpy scalars and one-element tensors numbers (through
    ``.item()``); anything else becomes its ``repr``. Nesting deeper than the protocol allows
    becomes a ``repr``, strings longer than it allows are cut, and past its count of values the
    rest of each container is replaced by one ``"… N more"`` item.
    """
    return _Converter().convert(value, 1)


def truncate(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending with ``…`` when it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Converter:
    """One conversion: counts the values made so far against :data:`MAX_NODES`."""

    def __init__(self) -> None:
        self.left = MAX_NODES - 16  # room for the "… N more" markers

    def convert(self, value: Any, depth: int) -> Any:
        self.left -= 1
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            return truncate(value)
        if isinstance(value, int):
            return value if -_INT_RANGE <= value < _INT_RANGE else wire_number(float(value))
        if isinstance(value, float):
            return wire_number(value)
        if depth >= MAX_DEPTH:
            return truncate(repr(value))
        if isinstance(value, Mapping):
            return self._mapping(value, depth)
        if isinstance(value, list | tuple | set | frozenset):
            return self._sequence(value, depth)
        item = getattr(value, "item", None)  # numpy scalars, 0-d / 1-element tensors
        if callable(item) and getattr(value, "ndim", 1) == 0:
            try:
                return self.convert(item(), depth + 1)
            except (TypeError, ValueError, RuntimeError):
                pass
        return truncate(repr(value))

    def _mapping(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if self.left <= 0:
                result["…"] = f"{len(value) - index} more"
                break
            result[truncate(str(key), MAX_NAME_CHARS)] = self.convert(item, depth + 1)
        return result

    def _sequence(self, value: Any, depth: int) -> list[Any]:
        result: list[Any] = []
        items = list(value)
        for index, item in enumerate(items):
            if self.left <= 0:
                result.append(f"… {len(items) - index} more")
                break
            result.append(self.convert(item, depth + 1))
        return result
