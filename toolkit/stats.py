"""Read-only numbers about queues: item counts by status for listings and health."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from queuectl.engine import adapter_for
from queuectl.registry import list_queues
from queuectl.kindspec import kind_template_values
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.sqlfiles import render

STATUS_NAMES = {0: "ready", 1: "processing", 2: "done", 3: "dead"}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}
COUNT_KEYS = ("ready", "scheduled", "processing", "done", "dead")


def queue_counts(conn: Connection, name: str, kind: str, schema: str = DEFAULT_SCHEMA) -> dict[str, int]:
    """Items by status; READY items that are not yet due count as scheduled."""
    names = QueueNames(name, schema)
    values = {**names.template_values(), **kind_template_values(names, kind)}
    sql = render(adapter_for(conn).sql_dir, kind, "counts", values)
    result = dict.fromkeys(COUNT_KEYS, 0)
    for row in conn.execute(sa.text(sql)):
        result["scheduled" if row.scheduled else STATUS_NAMES[row.status]] += row.n
    return result


def queue_overview(engine: Engine, schema: str = DEFAULT_SCHEMA) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            {
                "name": q.name,
                "kind": q.kind,
                "schema_version": q.schema_version,
                "created_at": q.created_at,
                "settings": q.settings.as_dict(),
                "counts": queue_counts(conn, q.name, q.kind, schema),
            }
            for q in list_queues(conn, schema)
        ]
