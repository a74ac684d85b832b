"""Read-only numbers about queues: item counts by status for listings and health."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from queuectl.engine import adapter_for
from queuectl.registry import get_queue, list_queues
from queuectl.kindspec import kind_template_values
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.sqlfiles import render

STATUS_NAMES = {0: "ready", 1: "processing", 2: "done", 3: "dead"}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}
COUNT_KEYS = ("ready", "scheduled", "processing", "done", "dead")


def queue_counts(conn: Connection, name: str, kind: str, schema: str = DEFAULT_SCHEMA, *,
                 fanout: bool | None = None) -> dict[str, int]:
    """Items by status; READY items that are not yet due count as scheduled. A fan-out ring
    keeps no FULL slot (each subscription reads every message through its own cursor): it
    counts as ready what its slowest live subscription has not been handed yet, and as
    processing the claims its subscriptions hold. `fanout`: whether the ring is one (None:
    read from the registry)."""
    names = QueueNames(name, schema)
    values = {**names.template_values(), **kind_template_values(names, kind)}
    sql_dir = adapter_for(conn).sql_dir
    sql = render(sql_dir, kind, "counts", values)
    result = dict.fromkeys(COUNT_KEYS, 0)
    for row in conn.execute(sa.text(sql)):
        result["scheduled" if row.scheduled else STATUS_NAMES[row.status]] += row.n
    if kind == "ring":
        if fanout is None:
            info = get_queue(conn, name, schema)
            fanout = info is not None and bool(getattr(info.settings, "fanout", False))
        if fanout:
            subs = conn.execute(sa.text(render(sql_dir, "ring", "subscriptions", values))).mappings().all()
            live = [s for s in subs if s["dropped_at"] is None]
            result["ready"] += max((int(s["lag"] or 0) for s in live), default=0)
            result["processing"] += sum(int(s["claimed"] or 0) for s in live)
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
                "counts": queue_counts(conn, q.name, q.kind, schema, fanout=bool(getattr(q.settings, "fanout", False))),
            }
            for q in list_queues(conn, schema)
        ]
