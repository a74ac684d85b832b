"""The words of a health verdict: statuses, thresholds, and how values are written.

queuectl.health grades what it gathers with these; the CLI reads them for `--help` (the
default thresholds) and to render a report. They import nothing heavy: the CLI loads this
module for every command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from queuectl.durations import duration_seconds
from queuectl.errors import UsageError

OK, INFO, WARNING, CRITICAL = "OK", "INFO", "WARNING", "CRITICAL"
STATUSES = (OK, INFO, WARNING, CRITICAL)
RANK = {OK: 0, INFO: 0, WARNING: 1, CRITICAL: 2}
EXIT_CODES = {OK: 0, WARNING: 1, CRITICAL: 2}


@dataclass(frozen=True)
class Threshold:
    """A value at or above ``warn`` is a WARNING, at or above ``crit`` CRITICAL; None = off."""

    name: str
    unit: str  # seconds | count | percent | xids
    warn: float | None
    crit: float | None
    help: str


def _t(name: str, unit: str, warn: float | None, crit: float | None, help: str) -> Threshold:
    return Threshold(name, unit, warn, crit, help)


# The index upkeep's defaults: `queuectl reorganize` acts from these, and health's index
# check judges with the same values, so an index health calls bloated is one reorganize
# rebuilds and an index reorganize leaves alone as small is never advised.
MIN_INDEX_PAGES = 1000              # smaller indexes are left alone (Randal / Ola Hallengren: 1000)
REBUILD_BLOAT_PCT = 30.0            # rebuild above this estimated bloat (PostgreSQL) ...
REBUILD_FRAGMENTATION_PCT = 30.0    # ... or this leaf fragmentation (the classic 30 %)
WATCH_PCT = 5.0                     # watch (PostgreSQL) / reorganize (SQL Server) from this (the classic 5 %)
MIN_PAGE_DENSITY_PCT = 70.0         # SQL Server: reorganize a leaf level less full than this share of its fill factor
# The measured upkeep of the scheduler's default plan vacuums a table only from this many
# dead rows (health's dead_tuples warning), so a quiet queue is not vacuumed every run.
UPKEEP_MIN_DEAD_ROWS = 10_000
# A pending item due longer ago than this and still waiting is overdue.
OVERDUE_AFTER_S = 60.0

# Sources: dba.md 3.6 (suggested checks), PlanetScale's ~24k dead tuples that tripled claim
# time, pganalyze's xmin-horizon check (24 h there; a queue needs minutes), check_postgres
# txn_idle, pgstatindex practice (density < 50-60 % = rebuild). A queue is app-specific:
# every value can be changed with --set or [health.thresholds] in a TOML file.
DEFAULT_THRESHOLDS: dict[str, Threshold] = {
    t.name: t
    for t in (
        _t("oldest_ready_age", "seconds", 300, 3600, "how long the oldest due item has waited"),
        _t("stuck_items", "count", 1, 100, "items in processing whose lease expired"),
        _t("dead_letters", "count", 1, 1000, "items that used up their attempts (dead)"),
        _t("backlog", "count", None, None, "due items waiting (off by default: app-specific)"),
        _t("watermark_lag", "count", 10_000, 1_000_000, "rows between the stored watermark and the head"),
        _t("ring_fill", "percent", 80, 95, "share of a ring's slots in use"),
        _t("rotation_lag", "count", 100_000, 1_000_000, "items since a reliable queue's generations last rotated"),
        _t("dead_tuples", "count", UPKEEP_MIN_DEAD_ROWS, 100_000, "dead row versions in one queue table"),
        _t("table_bloat", "percent", 40, 70, "free space beyond fillfactor in a queue table (pgstattuple_approx)"),
        _t("index_bloat", "percent", REBUILD_BLOAT_PCT, 60,
           "estimated bloat of a B-tree index, as queuectl reorganize measures it (its --bloat)"),
        _t("pending_overdue", "count", 100, 10_000, "pending items due over a minute ago and still waiting"),
        _t("xact_age", "seconds", 300, 3600, "age of a transaction or snapshot that holds back cleanup"),
        _t("idle_in_transaction", "seconds", 60, 600, "time a session has sat idle inside a transaction"),
        _t("prepared_xact_age", "seconds", 300, 3600, "age of a prepared (two-phase) transaction"),
        _t("slot_xmin_age", "xids", 1_000_000, 100_000_000, "transactions a replication slot or standby holds back"),
        _t("job_failures", "count", 1, 3, "failed runs of one job on one queue in the failure window"),
    )
}

_COUNT = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgG])?$")
_COUNT_FACTORS = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}


# Beyond these a value is a typo, not a setting (and inf / nan are never one).
MAX_SECONDS = 10 * 366 * 86400.0
MAX_COUNT = 1e15


def parse_value(unit: str, text: str | int | float) -> float | None:
    """'90s', '5m', '2h' (seconds); '10k', '1.5M' (counts); '61%' (percent); 'off' = None."""
    value = _parse_value(unit, text)
    if value is None:
        return None
    high = MAX_SECONDS if unit == "seconds" else 100.0 if unit == "percent" else MAX_COUNT
    if not 0 <= value <= high:  # also false for nan
        what = {"seconds": "a duration", "percent": "a percentage"}.get(unit, "a count")
        raise UsageError(f"{text!r} is not {what} from 0 to {high:,.0f}{'s' if unit == 'seconds' else ''}")
    return value


def _parse_value(unit: str, text: str | int | float) -> float | None:
    if isinstance(text, bool):
        raise UsageError(f"expected a number, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text)
    raw = str(text).strip()
    if raw.lower() in ("off", "none", ""):
        return None
    if unit == "seconds":
        seconds = duration_seconds(raw.lower())
        if seconds is not None:
            return seconds
        raise UsageError(f"{raw!r} is not a duration: use e.g. 90s, 5m, 2h, 1d")
    if unit == "percent":
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%?", raw)
        if m and float(m.group(1)) <= 100:
            return float(m.group(1))
        raise UsageError(f"{raw!r} is not a percentage from 0 to 100")
    m = _COUNT.fullmatch(raw)
    if m:
        return float(m.group(1)) * _COUNT_FACTORS[(m.group(2) or "").lower() or None]
    raise UsageError(f"{raw!r} is not a count: use e.g. 100, 10k, 1.5M")


def with_threshold(thresholds: dict[str, Threshold], name: str, level: str, value: Any) -> dict[str, Threshold]:
    if name not in thresholds:
        raise UsageError(f"unknown health threshold {name!r}: choose one of {', '.join(sorted(thresholds))}")
    if level not in ("warn", "crit"):
        raise UsageError(f"threshold level must be warn or crit, got {level!r} (e.g. {name}.warn=...)")
    updated = dict(thresholds)
    updated[name] = replace(thresholds[name], **{level: parse_value(thresholds[name].unit, value)})
    return updated


def apply_settings(thresholds: dict[str, Threshold], settings: Iterable[str]) -> dict[str, Threshold]:
    """Apply ``name.warn=VALUE`` / ``name.crit=VALUE`` strings (the CLI's --set)."""
    for item in settings:
        key, sep, value = item.partition("=")
        name, dot, level = key.strip().partition(".")
        if not sep or not dot:
            raise UsageError(f"--set expects NAME.warn=VALUE or NAME.crit=VALUE, got {item!r}")
        thresholds = with_threshold(thresholds, name, level.strip(), value.strip())
    check_order(thresholds)
    return thresholds


def check_order(thresholds: dict[str, Threshold]) -> None:
    for t in thresholds.values():
        if t.warn is not None and t.crit is not None and t.warn > t.crit:
            raise UsageError(f"threshold {t.name}: warn ({t.warn:g}) is above crit ({t.crit:g})")


def worst(*statuses: str) -> str:
    return max(statuses, key=lambda s: (RANK[s], s == INFO), default=OK)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.0f}s" if s >= 10 or s == int(s) else f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m" + (f" {int(s % 60)}s" if s < 600 and int(s % 60) else "")
    if s < 86400:
        return f"{int(s // 3600)}h" + (f" {int(s % 3600 // 60)}m" if int(s % 3600 // 60) else "")
    return f"{int(s // 86400)}d" + (f" {int(s % 86400 // 3600)}h" if int(s % 86400 // 3600) else "")


def fmt_count(n: float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor * 10 or (abs(n) >= factor and suffix != "k"):
            return f"{n / factor:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{n:,.0f}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for factor, suffix in ((2**40, "TB"), (2**30, "GB"), (2**20, "MB"), (2**10, "kB")):
        if n >= factor:
            return f"{n / factor:.1f} {suffix}"
    return f"{int(n)} B"


def fmt_threshold(unit: str, value: float | None) -> str:
    if value is None:
        return "off"
    if unit == "seconds":
        return fmt_duration(value)
    if unit == "percent":
        return f"{value:g}%"
    return fmt_count(value)
