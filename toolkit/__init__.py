"""queuectl: work queues as tables in the relational database you already run.

    from queuectl import open_queue, Queue, AsyncQueue, open_async_queue, Worker, Message

`open_queue(url, name)` returns the client of the queue's kind (reliable, heap, fifo, stack,
pending, watermark, ring); `await open_async_queue(url, name)` its asyncio twin. The public
names load on first use (PEP 562), so `queuectl --help` or a refused argument does not pay
for SQLAlchemy and the database driver.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queuectl.asyncworker import AsyncWorker
    from queuectl.client import EnqueueOutcomeUnknown, Queue, QueueFullError, open_queue
    from queuectl.client.aio import AsyncQueue, open_async_queue
    from queuectl.errors import (
        ConnectionFailed, NotInstalledError, PayloadTooLarge, QueuectlError, StatementCanceled, UsageError,
    )
    from queuectl.messages import Item, Message
    from queuectl.worker import Worker

# public name -> the module that defines it: one import for every kind, sync or asyncio
_PUBLIC = {
    "Queue": "queuectl.client",
    "open_queue": "queuectl.client",
    "EnqueueOutcomeUnknown": "queuectl.client",
    "QueueFullError": "queuectl.client",
    "AsyncQueue": "queuectl.client.aio",
    "open_async_queue": "queuectl.client.aio",
    "Worker": "queuectl.worker",
    "AsyncWorker": "queuectl.asyncworker",
    "Message": "queuectl.messages",
    "Item": "queuectl.messages",
    "QueuectlError": "queuectl.errors",
    "UsageError": "queuectl.errors",
    "NotInstalledError": "queuectl.errors",
    "ConnectionFailed": "queuectl.errors",
    "PayloadTooLarge": "queuectl.errors",
    "StatementCanceled": "queuectl.errors",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'queuectl' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
