"""Handlers the worker tests run, in `queuectl worker` subprocesses (--handler
activation_handlers:record) or in threads. A handler's effect is a row in table `handled`
of the test database ($QT_HANDLED_DSN), committed before the handler returns: "processed
twice" is judged by these rows, not by the queue's own bookkeeping."""

from __future__ import annotations

import os
import signal
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


def record_unless_poison(message) -> None:
    """`record`, except for an item whose text starts with "poison": that one does what
    $QT_POISON says before anything is recorded: "sigkill" or "exit" (os._exit(3)) its own
    process, raise "system_exit" / "keyboard_interrupt", raise a plain error ("raise") or
    one whose text holds a NUL byte ("nul")."""
    if message.text.startswith("poison"):
        how = os.environ["QT_POISON"]
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "exit":
            os._exit(3)
        if how == "system_exit":
            raise SystemExit(f"{message.text} asks to exit")
        if how == "keyboard_interrupt":
            raise KeyboardInterrupt(message.text)
        if how == "raise":
            raise RuntimeError(f"cannot handle {message.text}")
        if how == "nul":
            raise ValueError(f"cannot parse {message.text}: bad byte \x00 at 3")
        raise AssertionError(f"unknown QT_POISON {how!r}")
    record(message)
