"""Durations as people write them in configs and options: '250ms', '30s', '5m', '2h', '30d'."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration_seconds(text: str) -> float | None:
    """Seconds from '250ms', '30s', '5m', '2h', '30d' or a plain number; None when `text` is
    not a duration (the caller words the error for its own option)."""
    match = _DURATION.match(text)
    return None if match is None else float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
