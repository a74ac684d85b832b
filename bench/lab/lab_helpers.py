"""What the lab's probes share beyond the product bench: their own SQL (sql/probes.sql
beside them, or a probe's own sql/<name>.sql), and the set-up steps only probes take
(autovacuum_off, claimed_items). Imported by the probes as
`lab_helpers` (they run as `python bench/lab/<probe>.py`, which puts this folder first on
sys.path)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

SQL_DIR = Path(__file__).resolve().parent / "sql"
_HEADER = re.compile(r"^-- name: (\w+)$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@cache
def _sections(stem: str) -> dict[str, str]:
    parts = _HEADER.split((SQL_DIR / f"{stem}.sql").read_text("utf-8"))
    return dict(zip(parts[1::2], parts[2::2]))


def lab_sql(stem: str, section: str, values: dict[str, str | int]) -> str:
    """A section of sql/<stem>.sql, its {{placeholders}} filled from quoted names or ints
    (QueueNames.template_values(), names.qualified(), int())."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), _sections(stem)[section]).strip() + "\n"


def probe_sql(section: str, values: dict[str, str | int]) -> str:
    """A section of sql/probes.sql (lab_sql's rules)."""
    return lab_sql("probes", section, values)


def autovacuum_off(engine: Engine, tables: Sequence[str]) -> None:
    """Keep autovacuum off these tables (quoted, qualified names) for a probe's runs."""
    with engine.begin() as conn:
        for table in tables:
            conn.exec_driver_sql(probe_sql("plan_guard_no_autovacuum", {"table": table}))


def claimed_items(queue: Any, items: int, payload: bytes = b"x" * 300) -> list[Any]:
    """`items` messages of `payload` enqueued on a queue.Queue (500 a call), then all claimed
    (100 a call): the claimed messages, for the probe to ack or to leave leased."""
    for start in range(0, items, 500):
        queue.enqueue_many([payload] * min(500, items - start))
    taken: list[Any] = []
    while batch := queue.dequeue(100):
        taken += batch
    return taken
