"""Handlers for `queuectl worker` subprocesses in the fault tests. They touch no database,
so killing database backends cannot make a handler itself fail.

`append` writes each item's text to $QT_HANDLED_FILE. `record` writes one ledger line per
delivery to $QT_LEDGER_FILE (the "got" record of fault_workers' consumers: the id and the
attempt, before the work), works $QT_WORK_S seconds, SIGKILLs its own process on the
killer items (is_killer, one in about $QT_KILLER_EVERY; none when unset: under `queuectl
worker --processes` that is a handler process dying), and fails the poison items
(is_poison) so they go to dead letters after their last attempt.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import zlib

_lock = threading.Lock()


def append(message) -> None:
    with _lock, open(os.environ["QT_HANDLED_FILE"], "a") as out:
        out.write(message.text + "\n")
        out.flush()


def is_poison(text: str, every: int) -> bool:
    """About one payload in `every` is poison, the same ones in every run."""
    return every > 0 and zlib.crc32(text.encode()) % every == 0


def is_killer(text: str, every: int) -> bool:
    """About one payload in `every` kills the process running its handler, the same ones in
    every run, drawn independently of the poison items."""
    return is_poison(text + "#kill", every)


def record(message) -> None:
    line = json.dumps({"ev": "got", "ids": [message.id], "attempts": [message.attempts], "pid": os.getpid(),
                       "t": time.time()})
    # One write per line on an O_APPEND file: lines of concurrent handler processes do not interleave.
    with _lock, open(os.environ["QT_LEDGER_FILE"], "a") as out:
        out.write(line + "\n")
    time.sleep(float(os.environ.get("QT_WORK_S", "0")))
    if is_killer(message.text, int(os.environ.get("QT_KILLER_EVERY", "0"))):
        os.kill(os.getpid(), signal.SIGKILL)
    if is_poison(message.text, int(os.environ.get("QT_POISON_EVERY", "0"))):
        raise ValueError(f"poison item {message.text}")
