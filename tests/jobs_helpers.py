"""Helpers the tests share: polling (wait_until), reading the live and history tables."""

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


def add_finished_rows(engine: Engine, n: int, queue: str = "orders", schema: str = "queuectl") -> None:
    """n DONE items with payloads, written directly (fast test setup for archive backlogs), into
    the current generation's slot (reliable_0012)."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            f'WITH s AS (SELECT (last_value % 3)::smallint AS slot FROM "{schema}"."{queue}_rot_epoch"), '
            f'm AS (INSERT INTO "{schema}"."{queue}_meta" (slot, status, attempts, dequeued_at, finished_at) '
            f"SELECT s.slot, 2, 1, now(), now() FROM generate_series(1, :n), s RETURNING id, slot) "
            f'INSERT INTO "{schema}"."{queue}_data" (slot, id, payload) '
            f"SELECT slot, id, convert_to('done-' || id, 'UTF8') FROM m"),
            {"n": n})


def invoke(capsys, monkeypatch, *args: str, url: str | None = None) -> tuple[int, str, str]:
    """Run `queuectl ARGS` in this process through cli.main (fast; same exit-code mapping)."""
    import sys

    from queuectl import cli

    if url is not None:
        monkeypatch.setenv("QUEUECTL_URL", url)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", ["queuectl", *args])
    capsys.readouterr()
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err
