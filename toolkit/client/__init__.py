"""The Python clients, one import for every kind.

`Queue` is the reliable queue's client (meta/data split, leases, ack/nack; reliable.py);
the other kinds' clients (heap, fifo, stack, pending, watermark, ring) are in kinds.py, and
`open_queue` reads a queue's kind from the registry and returns the right one.
"""

from queuectl.client.kinds import (
    CLIENTS, FifoQueue, HeapQueue, KindQueue, PendingQueue, QueueFullError, ReleasedClaim, RingQueue,
    StackQueue, Subscription, SubscriptionInfo, WatermarkQueue, correct_watermark, open_queue, repair_ring,
)
from queuectl.client.reliable import EnqueueOutcomeUnknown, Queue

__all__ = [
    "CLIENTS", "EnqueueOutcomeUnknown", "FifoQueue", "HeapQueue", "KindQueue", "PendingQueue", "Queue",
    "QueueFullError", "ReleasedClaim", "RingQueue", "StackQueue", "Subscription", "SubscriptionInfo", "WatermarkQueue",
    "correct_watermark", "open_queue", "repair_ring",
]
