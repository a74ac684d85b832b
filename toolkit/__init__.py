"""queuectl: work queues as tables in the relational database you already run."""

from queuectl.errors import QueuectlError, UsageError
from queuectl.client import Queue
from queuectl.messages import Message

__all__ = ["Message", "Queue", "QueuectlError", "UsageError"]
__version__ = "0.1.0"
