"""queuectl: work queues as tables in the relational database you already run.

The public names load on first use (PEP 562), so `queuectl --help` or a refused argument
does not pay for SQLAlchemy and the database driver.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queuectl.client import Queue
    from queuectl.errors import QueuectlError, UsageError
    from queuectl.messages import Message

# public name -> the module that defines it
_PUBLIC = {
    "Message": "queuectl.messages",
    "Queue": "queuectl.client",
    "QueuectlError": "queuectl.errors",
    "UsageError": "queuectl.errors",
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
