"""Validation and quoting of every identifier queuectl puts into SQL.

Queue and schema names reach SQL only through this module: a name is checked against a
strict pattern first, then double-quoted. Nothing a user types is pasted into SQL text
any other way.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from queuectl.errors import UsageError

# 48 characters leave room for the longest derived suffix ("_meta0_finished": 15) inside
# PostgreSQL's 63-byte identifier limit, and for SQL Server's object names.
QUEUE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
SCHEMA_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
DEFAULT_SCHEMA = "queuectl"

# Every schema-level object a queue creates is named "<queue>_<suffix>", in the catalog's
# schema: tables, indexes, sequences and functions (PostgreSQL), tables, indexes, sequences
# and procedures (SQL Server, where they share one namespace), and Alembic's version table
# with its key. These are the suffixes of each kind, over all of its revisions;
# tests/test_object_names.py checks them against what a real install of every kind at every
# revision creates. (Constraint and trigger names are scoped to their table on PostgreSQL and
# left unnamed on SQL Server, so they are not listed.)
# reliable_0012's rotation functions (sql/postgresql/reliable.sql: create_functions, create_rotator)
ROTATION_CALLS = ("rot_move", "rot_follow", "rot_state", "rot_switch", "rot_seal", "rot_mark", "rot_copy",
                  "rot_next_empty", "rot_empty")
# reliable_0012's claim and ack on the parents ("claim_in") and on each slot's own tables
# ("claim_in0".."claim_in2"), which dequeue and ack call (create_claim_calls)
CLAIM_CALLS = tuple(f"{call}{slot}" for call in ("claim_in", "ack_in") for slot in ("", "0", "1", "2"))
# reliable_0013's extend_lease, nack and release on each slot's own tables, which the API
# functions call first (create_lease_calls)
LEASE_CALLS = tuple(f"{call}{slot}" for call in ("extend_in", "nack_in", "release_in") for slot in ("0", "1", "2"))
_COMMON_SUFFIXES = ("version", "version_pkc", "enqueue", "enqueue_many", "dequeue")
_ITEMS_SUFFIXES = ("items", "items_pkey", "items_id_seq")
QUEUE_OBJECT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "reliable": (
        *_COMMON_SUFFIXES, "meta", "meta_pkey", "meta_id_seq", "meta_ready", "meta_leased", "meta_finished",
        "data", "data_pkey", "history", "history_pkey", "history_at",
        "ack", "nack", "extend_lease", "release", "ack_dequeue", "notify", "wait_begin", "wait_end",
        # reliable_0012's generations: the slot tables and their indexes, the rotation state
        # and the rotator's calls
        *(f"meta{s}{end}" for s in range(3) for end in ("", "_pkey", "_ready", "_leased", "_finished")),
        *(f"data{s}{end}" for s in range(3) for end in ("", "_pkey")),
        "rot_epoch", "rot_sealed", "rot_emptied", "rot_start", *ROTATION_CALLS, *CLAIM_CALLS, *LEASE_CALLS,
    ),
    "heap": (*_COMMON_SUFFIXES, *_ITEMS_SUFFIXES),
    "fifo": (*_COMMON_SUFFIXES, *_ITEMS_SUFFIXES),
    "stack": (*_COMMON_SUFFIXES, *_ITEMS_SUFFIXES),
    "pending": (*_COMMON_SUFFIXES, *_ITEMS_SUFFIXES, "items_due"),
    "watermark": (*_COMMON_SUFFIXES, *_ITEMS_SUFFIXES, "watermark", "watermark_pkey", "correct_watermark"),
    "ring": (*_COMMON_SUFFIXES, "ring", "ring_pkey", "push_seq", "pop_seq", "ring_repair", "ring_release",
             "ring_push", "subs", "subs_pkey", "subs_name_key", "sub_slots", "sub_slots_pkey", "publish", "subscribe",
             "unsubscribe", "subscriptions", "sub_take", "sub_done", "sub_return", "fanout_guard",
             # ring_0007's side table for messages larger than a slot's in-row width
             "ring_large", "large_pkey", "large_seq"),
}
# Suffixes whose objects exist on SQL Server only: the ring's push procedure, which enqueue,
# enqueue_many and ring_release call through an OUTPUT parameter (sql/mssql/ring.sql).
SQL_SERVER_ONLY_SUFFIXES: dict[str, tuple[str, ...]] = {"ring": ("ring_push",)}
OBJECT_SUFFIXES = frozenset(s for suffixes in QUEUE_OBJECT_SUFFIXES.values() for s in suffixes)
# The catalog's own objects, in the same schema (catalog_*.py revisions and the lock seed).
CATALOG_OBJECTS = frozenset({
    "alembic_version", "alembic_version_pkc", "queues", "queues_pkey", "lock_seed", "lock_seed_pkey",
    "job_runs", "job_runs_pkey", "job_runs_id_seq", "job_runs_job_queue_started", "job_runs_started",
    "health_snapshots", "health_snapshots_pkey", "health_snapshots_id_seq", "health_snapshots_queue_taken",
    "pipeline_exports", "pipeline_exports_pkey",
})


def _joining_words(outer: frozenset[str] | tuple[str, ...], inner: frozenset[str] | tuple[str, ...]) -> frozenset[str]:
    """The words w for which an outer suffix is "<w>_<an inner suffix>" ("ack" from ack_dequeue
    and dequeue): a queue "<q>_<w>" with the inner suffix would own "<q>_<w>_<inner>", the
    name of the outer object of a queue <q>. Queue "b_ack"'s dequeue is queue "b"'s ack_dequeue."""
    return frozenset(s1[: -len(s2) - 1] for s1 in outer for s2 in inner if s1.endswith("_" + s2))


def clashing_endings(kind: str) -> frozenset[str]:
    """The endings a new queue of this kind may not have ("_ack" for every kind, "_ring" for a
    reliable queue, "_correct" for a watermark one)."""
    return _joining_words(OBJECT_SUFFIXES, QUEUE_OBJECT_SUFFIXES[kind])


# Names whose objects would be the catalog's ("alembic": alembic_version).
RESERVED_QUEUE_NAMES = frozenset(
    c[: -len(s) - 1] for c in CATALOG_OBJECTS for s in OBJECT_SUFFIXES if c.endswith("_" + s)
)
# Words a DBA could not write unquoted as a schema or object name on one of the engines:
# PostgreSQL's reserved keywords (pg_get_keywords() catcode 'R') and those reserved except
# as function or type names ('T'), and SQL Server's reserved keywords (Transact-SQL's list;
# ODBC's and "future" keywords are not enforced by the server). queuectl quotes every
# identifier, but the SQL API is for any language and hand-written SQL: `SELECT * FROM
# user.orders_meta` must not be a syntax error. tests/test_bad_input.py checks the
# PostgreSQL part against the live server's keyword list.
SQL_RESERVED_WORDS = frozenset(
    """
    all analyse analyze and any array as asc asymmetric both case cast check collate column
    constraint create current_catalog current_date current_role current_time current_timestamp
    current_user default deferrable desc distinct do else end except false fetch for foreign from
    grant group having in initially intersect into lateral leading limit localtime localtimestamp
    not null offset on only or order placing primary references returning select session_user
    some symmetric table then to trailing true union unique user using variadic when where window
    with
    authorization binary collation concurrently cross current_schema freeze full ilike inner is
    isnull join left like natural notnull outer overlaps right similar tablesample verbose
    add alter backup begin between break browse bulk by cascade checkpoint close clustered
    coalesce commit compute contains containstable continue convert current cursor database dbcc
    deallocate declare delete deny disk distributed double drop dump errlvl escape exec execute
    exists exit external file fillfactor freetext freetexttable function goto holdlock identity
    identity_insert identitycol if index insert key kill lineno load merge national nocheck
    nonclustered nullif of off offsets open opendatasource openquery openrowset openxml option
    over percent pivot plan precision print proc procedure public raiserror read readtext
    reconfigure replication restore restrict return revert revoke rollback rowcount rowguidcol
    rule save schema securityaudit semantickeyphrasetable semanticsimilaritydetailstable
    semanticsimilaritytable set setuser shutdown statistics system_user textsize top tran
    transaction trigger truncate try_convert tsequal unpivot update updatetext use values varying
    view waitfor while writetext
    """.split()
)
# PostgreSQL's default schema: reserved on SQL Server only as a role name, and where many
# PostgreSQL users keep their tables.
ALLOWED_RESERVED_SCHEMAS = frozenset({"public"})
_IDENT_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# LISTEN/NOTIFY channels are identifiers too (at most 63 bytes); '.' joins schema and queue.
_CHANNEL_RE = re.compile(r"^[a-z][a-z0-9_.]{0,62}$")


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 64 else f"{str(name)[:40]}..."
        raise UsageError(
            f"invalid queue name {shown!r}: use 1-48 characters, lowercase letters, digits and "
            "underscores, starting with a letter (e.g. 'orders')"
        )
    if name in RESERVED_QUEUE_NAMES:
        raise UsageError(f"queue name {name!r} is reserved for queuectl's catalog: choose another")
    if name in SQL_RESERVED_WORDS:
        raise UsageError(f"queue name {name!r} is an SQL reserved word: choose another (e.g. '{name}_queue')")
    return name


def object_names(queue: str, kind: str) -> frozenset[str]:
    """Every name a queue of that name and kind may give an object, at any of its revisions."""
    return frozenset(f"{queue}_{suffix}" for suffix in QUEUE_OBJECT_SUFFIXES[kind])


def shared_object_names(queue: str, kind: str, other: str, other_kind: str) -> list[str]:
    """The object names two queues would both own: none for two names a new install accepts
    (validate_new_queue_name); an install by an older queuectl may hold such a pair."""
    return sorted(object_names(queue, kind) & object_names(other, other_kind)) if queue != other else []


def validate_new_queue_name(name: str, kind: str) -> str:
    """A name for a queue of `kind` being installed: valid, and no queue's objects can ever be
    named like its own. Of two queues whose objects could share a name, one is named after the
    other plus a joining word (clashing_endings), and that one is refused here, so the pair
    never exists, whichever is installed first. Names already installed stay usable
    (validate_queue_name)."""
    validate_queue_name(name)
    for word in sorted(clashing_endings(kind)):
        owner = name[: -len(word) - 1]
        if owner and name.endswith("_" + word):
            ours = next(s for s in sorted(QUEUE_OBJECT_SUFFIXES[kind]) if f"{word}_{s}" in OBJECT_SUFFIXES)
            raise UsageError(
                f"queue name {name!r} ends in '_{word}': '{name}_{ours}' would be both this queue's "
                f"{ours} and the {word}_{ours} of a queue {owner!r}, so a grant or drop could reach the "
                "other queue: choose another name"
            )
    return name


def validate_schema_name(name: str) -> str:
    if not isinstance(name, str) or not SCHEMA_NAME_RE.fullmatch(name) or name.startswith("pg_"):
        shown = name if isinstance(name, str) and len(name) <= 64 else f"{str(name)[:40]}..."
        raise UsageError(
            f"invalid schema name {shown!r}: use 1-48 characters, lowercase letters, digits and "
            "underscores, starting with a letter and not with 'pg_'"
        )
    if name in SQL_RESERVED_WORDS and name not in ALLOWED_RESERVED_SCHEMAS:
        raise UsageError(f"schema name {name!r} is an SQL reserved word: choose another (e.g. '{name}_queues')")
    return name


def quote_ident(name: str) -> str:
    """Double-quote an identifier built from validated names (so it holds no quote to escape)."""
    if not _IDENT_RE.fullmatch(name):
        raise UsageError(f"refusing to quote unvalidated identifier {name!r}")
    return f'"{name}"'


# Names queuectl did not choose but reads back from the server's catalog: SQL Server names
# an unnamed PRIMARY KEY's index itself (PK__orders_m__3213E83F5D1A8B2C). Letters, digits
# and underscores only, at most 128 characters (SQL Server's sysname), so the double
# quotes need no escaping; anything else is refused and left alone by the caller.
_CATALOG_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def quote_catalog_ident(name: str) -> str:
    """Double-quote an index name read from the server's catalog (not typed by a user)."""
    if not isinstance(name, str) or not _CATALOG_IDENT_RE.fullmatch(name):
        raise UsageError(f"refusing to quote catalog name {name!r}: not letters, digits and underscores")
    return f'"{name}"'


@dataclass(frozen=True)
class QueueNames:
    """Every object name of one queue, validated once, quoted on the way out."""

    queue: str
    schema: str = DEFAULT_SCHEMA

    def __post_init__(self) -> None:
        validate_queue_name(self.queue)
        validate_schema_name(self.schema)

    def table(self, suffix: str) -> str:
        return f"{self.queue}_{suffix}"

    def qualified(self, suffix: str) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.table(suffix))}"

    def catalog_table(self, table: str) -> str:
        """A catalog table beside the queue's objects, e.g. "queuectl"."pipeline_exports"."""
        return f"{quote_ident(self.schema)}.{quote_ident(table)}"

    @property
    def version_table(self) -> str:
        """Alembic version table that tracks this queue's own schema version."""
        return self.table("version")

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel the queue announces new items on: "<schema>.<queue>".

        '.' occurs in neither name, so two queues never share a channel. A pair longer than
        63 bytes (PostgreSQL would truncate it) keeps readable prefixes and a 64-bit hash of
        the full pair; a hash collision would only cost a spurious wake-up, never an item.
        """
        full = f"{self.schema}.{self.queue}"
        if len(full) > 63:
            digest = hashlib.sha256(full.encode()).hexdigest()[:16]
            full = f"{self.schema[:20]}.{self.queue[:24]}.{digest}"
        if not _CHANNEL_RE.fullmatch(full):
            raise UsageError(f"refusing to use unvalidated channel name {full!r}")
        return full

    def template_values(self) -> dict[str, str]:
        """The identifiers a SQL template may use, all quoted."""
        q = self.qualified
        values = {
            "schema": quote_ident(self.schema),
            "queue_literal": f"'{self.queue}'",
            "meta": q("meta"),
            "data": q("data"),
            "history": q("history"),
            "meta_seq": q("meta_id_seq"),
            "meta_seq_regclass": f"'{q('meta_id_seq')}'",
            "ready_idx": quote_ident(self.table("meta_ready")),
            "leased_idx": quote_ident(self.table("meta_leased")),
            "finished_idx": quote_ident(self.table("meta_finished")),
            "history_at_idx": quote_ident(self.table("history_at")),
            "registry": f"{quote_ident(self.schema)}.{quote_ident('queues')}",
            "notify_trigger": quote_ident(self.table("notify")),
            "channel": f'"{self.channel}"',
            "channel_literal": f"'{self.channel}'",
        }
        for fn in ("enqueue", "enqueue_many", "dequeue", "ack", "nack", "extend_lease", "release", "notify",
                   "ack_dequeue", "wait_begin", "wait_end", *ROTATION_CALLS, *CLAIM_CALLS, *LEASE_CALLS):
            values[f"fn_{fn}"] = q(fn)
        # reliable_0012's generation layout: bare names for RENAME TO and index names,
        # qualified ones for tables and sequences, text literals for regclass arguments
        bare = {"meta_name": "meta", "data_name": "data", "meta_pkey": "meta_pkey", "data_pkey": "data_pkey"}
        for s in range(3):
            values[f"meta{s}"] = q(f"meta{s}")
            values[f"data{s}"] = q(f"data{s}")
            values[f"meta{s}_regclass"] = f"'{q(f'meta{s}')}'"
            values[f"data{s}_regclass"] = f"'{q(f'data{s}')}'"
            bare |= {f"meta{s}_name": f"meta{s}", f"data{s}_name": f"data{s}", f"data{s}_pkey": f"data{s}_pkey"}
            bare |= {f"meta{s}_{end}": f"meta{s}_{end}" for end in ("pkey", "ready", "leased", "finished")}
        values |= {key: quote_ident(self.table(suffix)) for key, suffix in bare.items()}
        for seq in ("rot_epoch", "rot_sealed", "rot_emptied", "rot_start"):
            values[seq] = q(seq)
            values[f"{seq}_regclass"] = f"'{q(seq)}'"
        values["data_regclass"] = f"'{q('data')}'"
        return values

    def claim_variants(self) -> list[dict[str, str]]:
        """reliable.sql create_claim_calls' own values for each of its four renderings: on the
        partitioned parents, then on each slot's tables."""
        q = self.qualified
        return [{"claim_fn": q(f"claim_in{s}"), "ack_fn": q(f"ack_in{s}"),
                 "claim_meta": q(f"meta{s}"), "claim_data": q(f"data{s}")} for s in ("", "0", "1", "2")]

    def lease_variants(self) -> list[dict[str, str]]:
        """reliable.sql create_lease_calls' own values for each of its three renderings, one
        per slot's tables."""
        q = self.qualified
        return [{"extend_fn": q(f"extend_in{s}"), "nack_fn": q(f"nack_in{s}"), "release_fn": q(f"release_in{s}"),
                 "lease_meta": q(f"meta{s}")} for s in ("0", "1", "2")]
