"""An item's size as DynamoDB counts it, against its 400 KB limit: each attribute's UTF-8 name plus
its value, numbers by their significant digits, lists and maps with their overhead."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

MAX_ITEM_BYTES = 400 * 1024
"""DynamoDB's item size limit (KB = 1024 bytes)."""


def item_size(item: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB counts it: each attribute's UTF-8 name plus its value."""
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def _value_size(value: Any) -> int:
    ((kind, data),) = value.items()
    if kind == "S":
        return len(str(data).encode())
    if kind == "N":
        return _number_size(str(data))
    if kind == "B":
        return len(data)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(x).encode()) for x in data)
    if kind == "NS":
        return sum(_number_size(str(x)) for x in data)
    if kind == "BS":
        return sum(len(x) for x in data)
    if kind == "L":
        return 3 + sum(1 + _value_size(x) for x in data)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + _value_size(v) for k, v in data.items())
    raise ValueError(f"unknown DynamoDB type {kind}")


def _number_size(text: str) -> int:
    """About one byte per two significant digits, plus one."""
    digits = format(abs(Decimal(text)).normalize(), "f").replace(".", "").strip("0") or "0"
    return (len(digits) + 1) // 2 + 1
