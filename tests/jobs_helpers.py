"""Helpers the job tests share: reading the live and history tables, polling."""

from __future__ import annotations

import time
from collections import Counter

import sqlalchemy as sa
from sqlalchemy.engine import Engine


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def scalar(engine: Engine, sql: str, **params):
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def rows(engine: Engine, sql: str, **params) -> list[sa.Row]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params))


def placement(engine: Engine, queue: str = "orders", schema: str = "queuectl") -> dict[str, Counter]:
    """Every id with its payload, per place: live (meta joined to data) and history."""
    live = rows(engine, f'SELECT m.id, d.payload FROM "{schema}"."{queue}_meta" m '
                        f'LEFT JOIN "{schema}"."{queue}_data" d ON d.id = m.id')
    history = rows(engine, f'SELECT id, payload FROM "{schema}"."{queue}_history"')
    return {
        "live": Counter((r.id, bytes(r.payload) if r.payload is not None else None) for r in live),
        "history": Counter((r.id, bytes(r.payload) if r.payload is not None else None) for r in history),
    }


def job_runs(engine: Engine, schema: str = "queuectl") -> list[sa.Row]:
    return rows(engine, f'SELECT * FROM "{schema}".job_runs ORDER BY started_at, id')
