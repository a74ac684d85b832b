"""The clients' argument checks: every value a caller passes is checked here and refused
with a one-line UsageError naming the argument, before anything is sent.

Shared by the reliable client (queuectl.client), the other kinds' clients
(queuectl.client.kinds) and the worker (queuectl.worker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from queuectl.catalog import QueueSettings
from queuectl.errors import UsageError
from queuectl.storable import headers_json, payload_bytes, shown

MAX_BATCH = 10_000


def schema_revision_number(revision: str | None) -> int:
    """'reliable_0003' -> 3 (0 when unknown)."""
    try:
        return int(str(revision).rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return 0


def payload_list(payloads: Iterable[bytes | str]) -> list[bytes]:
    """enqueue_many's payloads as bytes: any iterable of payloads, but not one payload
    (a str or bytes would be taken apart character by character) or a mapping."""
    if isinstance(payloads, (str, bytes, bytearray, memoryview, dict)) or not isinstance(payloads, Iterable):
        raise UsageError(f"payloads must be a list of bytes or str payloads, not {type(payloads).__name__}")
    return [payload_bytes(p, f"payloads[{i}]") for i, p in enumerate(payloads)]


def per_item(values: Any, n: int, what: str) -> list[Any]:
    """A list or tuple argument of enqueue_many with one entry per payload."""
    if not isinstance(values, (list, tuple)):
        raise UsageError(f"{what} must be a list with one entry per payload, not {type(values).__name__}")
    if len(values) != n:
        raise UsageError(f"{what} has {len(values)} entries for {n} payloads")
    return list(values)


def spread(value: Any, n: int, what: str, check: Callable[[Any, str], Any]) -> list[Any]:
    """One value for every payload, or a list or tuple of one per payload: each checked by
    check(value, name), the name indexed when it is one of a list (title[2])."""
    if isinstance(value, (list, tuple)):
        return [check(v, f"{what}[{i}]") for i, v in enumerate(per_item(value, n, what))]
    return [check(value, what)] * n


def headers_list(headers: Any, n: int, what: str = "headers") -> list[str | None] | None:
    """enqueue_many's headers (a list of dicts or None, or None) as JSON texts."""
    if headers is None:
        return None
    return [headers_json(h, f"{what}[{i}]") for i, h in enumerate(per_item(headers, n, what))]


def whole_number(value: Any, what: str, low: int, high: int) -> int:
    """An int (not a bool) from low to high, or UsageError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{what} must be a whole number from {low} to {high}, got {shown(value)}")
    return value


def check_batch(n: int) -> int:
    return whole_number(n, "batch size", 1, MAX_BATCH)


def check_seconds(value: float | None, what: str, low: float = 0.0, *, optional: bool = True) -> float | None:
    """A number of seconds from `low` to a year, as a float; None stays None when `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= 366 * 86400:
        raise UsageError(f"{what} must be a number of seconds from {low:g} to 31622400, got {shown(value)}")
    return float(value)


def check_priority(priority: int, what: str = "priority") -> int:
    return whole_number(priority, what, -32768, 32767)


def check_max_attempts(value: int | None) -> int | None:
    """A per-item max_attempts: None (the queue's) or the range a queue's setting has."""
    return None if value is None else whole_number(value, "max_attempts", *QueueSettings.LIMITS["max_attempts"])


def check_positive_seconds(value: float, what: str) -> float:
    """A number of seconds for arguments that have no 'unset' (None)."""
    return check_seconds(value, what, optional=False)
