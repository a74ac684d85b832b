"""What each queue kind is: its name, its install-time settings, the object names its SQL uses.

Imported by install, the migrations, stats and the clients, so it imports nothing of theirs.
The reliable kind keeps its own QueueSettings (catalog.py); the destructive kinds and the
ring have their own small settings classes with the same surface (as_dict, to_json,
from_dict), stored in the registry row's `settings` column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Union

from queuectl.catalog import QueueSettings
from queuectl.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from queuectl.errors import UsageError
from queuectl.names import QUEUE_OBJECT_SUFFIXES, QueueNames, quote_ident

KINDS = ("reliable", "heap", "fifo", "stack", "pending", "watermark", "ring")
DESTRUCTIVE_KINDS = ("heap", "fifo", "stack", "pending", "watermark")

# The tables of each kind whose indexes and dead rows the upkeep jobs (inspect, reorganize)
# look after, first the one that takes the queue's churn. A reliable queue's history is
# append-only and left out; the destructive kinds delete every row at dequeue, so their
# items table piles up dead rows and index ghosts; the ring updates its slots in place, its
# side table of large messages takes an insert and a delete per message, and a fan-out ring's
# claim rows and cursors are updated at every claim and ack; a watermark queue's one-row hint
# is rewritten at every correction.
UPKEEP_TABLES: dict[str, tuple[str, ...]] = {
    "reliable": ("meta", "data"),
    "heap": ("items",),
    "fifo": ("items",),
    "stack": ("items",),
    "pending": ("items",),
    "watermark": ("items", "watermark"),
    "ring": ("ring", "ring_large", "sub_slots", "subs"),
}
# Upkeep tables a kind's first revision does not create: the revision that does. A queue at
# an older revision has no such table, and its upkeep leaves it out (upkeep_tables).
UPKEEP_TABLES_SINCE: dict[str, str] = {"ring_large": "ring_0007", "sub_slots": "ring_0006", "subs": "ring_0006"}


def upkeep_tables(kind: str, revision: str | None = None) -> tuple[str, ...]:
    """The upkeep tables of a queue of `kind` at `revision` (None: the newest)."""
    return tuple(t for t in UPKEEP_TABLES[kind]
                 if revision is None or UPKEEP_TABLES_SINCE.get(t, "") <= revision)


RING_DEFAULT_SIZE = 65_536
RING_MAX_SIZE = 16_777_216  # 16 Mi slots: ~1 GB of slots at fillfactor 50 (PostgreSQL), ~3.3 GB at FILLFACTOR 20 (SQL Server)
RING_DEFAULT_LAG_LIMIT_SHARE = 2  # a fan-out subscription is behind past size // 2 messages

# The fan-out ring's functions (ring_0006): publish, the subscriptions' admin and their pops.
RING_FANOUT_CALLS = ("publish", "subscribe", "unsubscribe", "subscriptions", "sub_take", "sub_done", "sub_return",
                     "fanout_guard")
# The largest message (payload + headers) a slot holds in its own row; a larger one goes to the
# ring's side table (<queue>_ring_large) and the slot keeps a pointer. 1,800 bytes keeps a
# PostgreSQL slot row under the 2,032-byte TOAST threshold (the row's other columns and the
# headers' binary form take the rest), so the slots are never TOASTed: docs/kinds.md has the
# measurements behind it.
RING_DEFAULT_SLOT_BYTES = 1_800

# PostgreSQL truncates identifiers at 63 bytes; queue names may have 48 characters, which
# leaves 15 for a suffix. A kind whose objects need a longer suffix takes shorter names.
_IDENT_MAX = 63


def max_name_length(kind: str) -> int:
    longest = max(len(s) for s in QUEUE_OBJECT_SUFFIXES[validate_kind(kind)])
    return min(48, _IDENT_MAX - 1 - longest)


def validate_kind(kind: str) -> str:
    if kind not in KINDS:
        raise UsageError(f"unknown queue kind {kind!r}: choose one of {', '.join(KINDS)}")
    return kind


def check_name_fits(names: QueueNames, kind: str) -> None:
    """A watermark queue's `<name>_correct_watermark` must fit in 63 bytes, and so on."""
    limit = max_name_length(kind)
    if len(names.queue) > limit:
        raise UsageError(
            f"queue name {names.queue!r} is too long for kind {kind}: at most {limit} characters "
            f"(its SQL objects add suffixes up to {63 - limit} characters)"
        )


# -- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoSettings:
    """Heap, stack, pending and watermark queues have nothing to configure at install."""

    def as_dict(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "NoSettings":
        return cls()


@dataclass(frozen=True)
class FifoSettings(NoSettings):
    """strict: consumers wait for each other on the head row instead of skipping it."""

    strict: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.strict, bool):
            raise UsageError(f"strict must be true or false, got {self.strict!r}")

    def as_dict(self) -> dict[str, Any]:
        return {"strict": self.strict}

    @classmethod
    def from_dict(cls, data: dict) -> "FifoSettings":
        return cls(strict=bool(data.get("strict", False)))


@dataclass(frozen=True)
class RingSettings(NoSettings):
    """size: the number of preallocated slots (the most items the ring holds at once).

    fanout: every message goes to each of the ring's named subscriptions (consumers compete
    within a subscription) instead of to one consumer; chosen at install. lag_limit and
    drop_when_behind are the defaults of its subscriptions: a subscription more than
    lag_limit messages behind the pushes is behind (health CRITICAL), and one that asked to
    be dropped when behind is dropped by the next push. Default lag limit: half the ring
    (RING_DEFAULT_LAG_LIMIT_SHARE); default drop: no (a dropped subscription misses messages).

    slot_bytes: the largest message (payload + headers as text) stored in its slot's row; a
    larger one goes to the side table <queue>_ring_large (ring_0007).
    max_payload_bytes: the largest message push accepts (payload + headers as text); a larger
    one is refused by the server in one line (PayloadTooLarge) and nothing is stored.
    """

    size: int = RING_DEFAULT_SIZE
    fanout: bool = False
    lag_limit: int | None = None  # None: size // 2
    drop_when_behind: bool = False
    slot_bytes: int = RING_DEFAULT_SLOT_BYTES
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    LIMITS = {
        "size": (2, RING_MAX_SIZE),
        "slot_bytes": (0, 1024**3),
        # bytea and varbinary(max) values stop at 1 GiB (PostgreSQL) and 2 GiB (SQL Server)
        "max_payload_bytes": (1, 1024**3),
    }

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 2 <= self.size <= RING_MAX_SIZE:
            raise UsageError(f"size must be a whole number from 2 to {RING_MAX_SIZE:,}, got {self.size!r}")
        for key, (low, high) in self.LIMITS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UsageError(f"{key.replace('_', '-')} must be a whole number from {low:,} to {high:,}, got {value!r}")
        if not isinstance(self.fanout, bool) or not isinstance(self.drop_when_behind, bool):
            raise UsageError("fanout and drop_when_behind must be true or false")
        if not self.fanout and (self.lag_limit is not None or self.drop_when_behind):
            raise UsageError("a lag limit and drop-when-behind apply to a fan-out ring only (--fanout)")
        limit = self.lag_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= self.size):
            raise UsageError(f"lag limit must be a whole number from 1 to the ring's size ({self.size:,}), got {limit!r}")

    @property
    def default_lag_limit(self) -> int:
        """The lag limit a subscription gets when none is given."""
        return self.lag_limit if self.lag_limit is not None else max(1, self.size // RING_DEFAULT_LAG_LIMIT_SHARE)

    def as_dict(self) -> dict[str, Any]:
        limits = {key: getattr(self, key) for key in self.LIMITS}
        if not self.fanout:
            return limits
        return {**limits, "fanout": True, "lag_limit": self.default_lag_limit,
                "drop_when_behind": self.drop_when_behind}

    def subscription_values(self) -> dict[str, int]:
        """make_fanout's template values: the subscriptions' default lag limit and drop (0/1)."""
        return {"sub_lag_limit": self.default_lag_limit, "sub_drop": int(self.drop_when_behind)}

    @classmethod
    def from_dict(cls, data: dict) -> "RingSettings":
        # a ring installed before ring_0007 has no slot_bytes / max_payload_bytes: they take their defaults
        fanout = bool(data.get("fanout", False))
        return cls(fanout=fanout,
                   lag_limit=int(data["lag_limit"]) if fanout and data.get("lag_limit") is not None else None,
                   drop_when_behind=fanout and bool(data.get("drop_when_behind", False)),
                   **{k: int(v) for k, v in data.items() if k in cls.LIMITS})


AnySettings = Union[QueueSettings, NoSettings]
_SETTINGS = {"reliable": QueueSettings, "fifo": FifoSettings, "ring": RingSettings}


def settings_class(kind: str) -> type:
    return _SETTINGS.get(validate_kind(kind), NoSettings)


def default_settings(kind: str) -> AnySettings:
    return settings_class(kind)()


def check_settings(kind: str, settings: AnySettings | None) -> AnySettings:
    """The settings to install `kind` with: the defaults when None, else of the kind's class."""
    if settings is None:
        return default_settings(kind)
    wanted = settings_class(kind)
    if type(settings) is not wanted:
        raise UsageError(f"kind {kind} takes {wanted.__name__}, not {type(settings).__name__}")
    return settings


def settings_for(
    kind: str, *, reliable: QueueSettings | None = None, strict: bool = False, size: int | None = None,
    fanout: bool = False, lag_limit: int | None = None, drop_when_behind: bool = False,
    slot_bytes: int | None = None,
) -> AnySettings:
    """Build a kind's settings from command-line options; refuse options of other kinds."""
    validate_kind(kind)
    if strict and kind != "fifo":
        raise UsageError("--strict applies to --kind fifo only")
    if size is not None and kind != "ring":
        raise UsageError("--size applies to --kind ring only")
    if (fanout or lag_limit is not None or drop_when_behind) and kind != "ring":
        raise UsageError("--fanout, --lag-limit and --drop-when-behind apply to --kind ring only")
    if slot_bytes is not None and kind != "ring":
        raise UsageError("--slot-bytes applies to --kind ring only")
    if kind == "reliable":
        return reliable or QueueSettings()
    if kind == "fifo":
        return FifoSettings(strict=strict)
    if kind == "ring":
        return RingSettings(size=RING_DEFAULT_SIZE if size is None else size, fanout=fanout, lag_limit=lag_limit,
                            drop_when_behind=drop_when_behind,
                            slot_bytes=RING_DEFAULT_SLOT_BYTES if slot_bytes is None else slot_bytes,
                            max_payload_bytes=(reliable or QueueSettings()).max_payload_bytes)
    return NoSettings()


# -- object names --------------------------------------------------------------------------


def kind_template_values(names: QueueNames, kind: str) -> dict[str, str]:
    """The identifiers a kind's SQL file uses beyond names.template_values(), all quoted.

    Only the kind's own names are computed, so a long reliable queue name never meets the
    longer suffixes of other kinds.
    """
    if kind == "reliable":
        return {}
    q = names.qualified

    def regclass(suffix: str) -> str:  # a text literal naming the relation, for ::regclass
        return f"'{q(suffix)}'"

    values = {f"fn_{fn}": q(fn) for fn in ("enqueue", "enqueue_many", "dequeue")}
    if kind == "ring":
        values.update(
            ring=q("ring"),
            push_seq=q("push_seq"),
            pop_seq=q("pop_seq"),
            push_seq_regclass=regclass("push_seq"),
            pop_seq_regclass=regclass("pop_seq"),
            ring_regclass=regclass("ring"),
            fn_ring_repair=q("ring_repair"),
            fn_ring_release=q("ring_release"),
            ring_large=q("ring_large"),
            # its key and ids, named to fit 63 bytes with a 48-character queue name (the
            # defaults, "<queue>_ring_large_pkey" and "<queue>_ring_large_id_seq", would not)
            ring_large_pkey=quote_ident(names.table("large_pkey")),  # a constraint: unqualified
            ring_large_seq=q("large_seq"),
            ring_large_regclass=regclass("ring_large"),
            fn_ring_push=q("ring_push"),  # SQL Server's push procedure (names.SQL_SERVER_ONLY_SUFFIXES)
            # fan-out (ring_0006): the subscriptions' tables and calls
            subs=q("subs"),
            sub_slots=q("sub_slots"),
            subs_regclass=regclass("subs"),
            sub_slots_regclass=regclass("sub_slots"),
            **{f"fn_{fn}": q(fn) for fn in RING_FANOUT_CALLS},
        )
        return values
    values.update(
        items=q("items"),
        items_seq=q("items_id_seq"),
        items_seq_regclass=regclass("items_id_seq"),
        items_regclass=regclass("items"),
    )
    if kind == "pending":
        values["due_idx"] = quote_ident(names.table("items_due"))
    if kind == "watermark":
        values.update(watermark=q("watermark"), fn_correct_watermark=q("correct_watermark"))
    return values
