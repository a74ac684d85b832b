"""The toolkit's own catalog: which queues exist, of which kind, at which schema version."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from queuectl.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from queuectl.errors import UsageError
from queuectl.names import validate_schema_name

CATALOG_BRANCH = "catalog"
CATALOG_VERSION_TABLE = "alembic_version"

# Column types of the registry, per engine: text/jsonb on PostgreSQL; on SQL Server a key
# column must be bounded (index keys are at most 900/1700 bytes) and JSON is nvarchar.
NAME_TYPE = sa.Text().with_variant(sa.NVARCHAR(128), "mssql")
SETTINGS_TYPE = JSONB().with_variant(sa.NVARCHAR(None), "mssql")


def queues_table(schema: str) -> sa.Table:
    """The registry of installed queues (one row per queue)."""
    return sa.Table(
        "queues",
        sa.MetaData(),
        sa.Column("name", NAME_TYPE, primary_key=True),
        sa.Column("kind", NAME_TYPE, nullable=False),
        sa.Column("schema_version", NAME_TYPE, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("settings", SETTINGS_TYPE, nullable=False),
        schema=validate_schema_name(schema),
    )


@dataclass(frozen=True)
class QueueSettings:
    """Per-queue settings baked into its SQL API at install (and kept in the registry)."""

    max_attempts: int = 5
    lease_seconds: int = 30
    backoff_base_seconds: int = 1
    backoff_max_seconds: int = 3600
    # The largest message enqueue accepts: payload + title + headers as stored (reliable_0010;
    # reliable_0003 counted the payload only); a larger one is refused by the server with
    # SQLSTATE QC413 and nothing is inserted. 1 MiB: a queue carries work items, not
    # documents (store those elsewhere and enqueue a reference).
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    # Allowed ranges; a plain class attribute (no annotation), not a dataclass field.
    LIMITS = {
        "max_attempts": (1, 1000),
        "lease_seconds": (1, 7 * 24 * 3600),
        "backoff_base_seconds": (0, 24 * 3600),
        "backoff_max_seconds": (0, 30 * 24 * 3600),
        # bytea and varbinary(max) values stop at 1 GiB (PostgreSQL) and 2 GiB (SQL Server)
        "max_payload_bytes": (1, 1024**3),
    }

    def __post_init__(self) -> None:
        for key, (low, high) in self.LIMITS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UsageError(f"{key.replace('_', '-')} must be a whole number from {low} to {high}, got {value!r}")

    def as_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in self.LIMITS}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "QueueSettings":
        return cls(**{k: v for k, v in data.items() if k in cls.LIMITS})



@dataclass(frozen=True)
class QueueInfo:
    name: str
    kind: str
    schema_version: str
    created_at: datetime
    settings: QueueSettings = field(default_factory=QueueSettings)
