"""Process bodies for the ring tests: sessions that die holding a claimed position."""

from __future__ import annotations

import os
import signal

from queuectl.client import QueueFullError, RingQueue


def pop_then_die(url: str, name: str, ready) -> None:
    """Pop on an empty ring (the call claims a position and keeps it), then die by SIGKILL
    with the claim held: no close(), no release."""
    queue = RingQueue(url, name)
    assert queue.dequeue(1, timeout=0.05) == []
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def push_then_die(url: str, name: str, ready) -> None:
    """Push into a full ring (the call claims a position and keeps it), then die by SIGKILL."""
    queue = RingQueue(url, name)
    try:
        queue.enqueue("never stored", timeout=0.05)
    except QueueFullError:
        pass
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)
