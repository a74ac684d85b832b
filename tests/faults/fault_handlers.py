"""A handler for `queuectl worker` subprocesses in the fault tests: it appends each item's
text to $QT_HANDLED_FILE (one line, flushed), touching no database, so killing database
backends cannot make the handler itself fail."""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()


def append(message) -> None:
    with _lock, open(os.environ["QT_HANDLED_FILE"], "a") as out:
        out.write(message.text + "\n")
        out.flush()
