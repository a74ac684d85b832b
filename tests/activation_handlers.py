"""Handlers the worker tests run, in `queuectl worker` subprocesses (--handler
activation_handlers:record) or in threads. A handler's effect is a row in table `handled`
of the test database ($QT_HANDLED_DSN), committed before the handler returns: "processed
twice" is judged by these rows, not by the queue's own bookkeeping."""

from __future__ import annotations

import os
import threading
import time

import psycopg

CREATE_TABLE = """CREATE TABLE handled (
    item text NOT NULL, pid integer NOT NULL, attempt integer NOT NULL,
    started timestamptz NOT NULL, finished timestamptz NOT NULL DEFAULT clock_timestamp())"""

_local = threading.local()


def _conn() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(os.environ["QT_HANDLED_DSN"], autocommit=True)
    return conn


def record(message) -> None:
    """Work for $QT_HANDLER_SLEEP seconds, then record the item."""
    started = time.time()
    time.sleep(float(os.environ.get("QT_HANDLER_SLEEP", "0")))
    _conn().execute(
        "INSERT INTO handled (item, pid, attempt, started) VALUES (%s, %s, %s, to_timestamp(%s))",
        (message.text, os.getpid(), message.attempts, started),
    )
