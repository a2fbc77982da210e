"""Model values as plain JSON data: the shape of `--json` output and of the state file."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


def _plain_field(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _dict_factory(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {key: _plain_field(value) for key, value in items}


def plain(value: Any) -> Any:
    """A dataclass (or a list/tuple/dict of them) as JSON-ready dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value, dict_factory=_dict_factory)
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return _plain_field(value)
