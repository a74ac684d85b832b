"""SQL Server, checked without a server: every name a T-SQL statement uses resolves.

test_mssql_offline proves the T-SQL parses; a parse accepts a misspelt column, an undeclared
variable or a procedure called with a parameter it does not have. This module walks the same
sqlfluff (tsql) parse trees and resolves every reference:

  * tables, views, sequences, procedures, functions and indexes (in FROM/JOIN/APPLY, DML
    targets, EXEC, NEXT VALUE FOR, CREATE INDEX/ALTER INDEX/UPDATE STATISTICS, DROP, GRANT,
    and the object names passed as strings to OBJECT_ID and sp_sequence_get_range) resolve
    to an object the install scripts or the sections create (the catalogue, below), or to a
    documented system object of the allow-list;
  * every column a statement names: `alias.column` against the alias's source, an
    unqualified column against the sources in scope (innermost first; a column found in two
    sources of one scope is ambiguous, as SQL Server says), `inserted.` / `deleted.` in an
    OUTPUT clause against the DML target, SET targets, INSERT / OUTPUT INTO column lists,
    index keys and filters, CHECK / DEFAULT / REFERENCES columns. A source is a catalogue
    table, an allow-listed system view or table-valued function, a CTE (its column list or
    its select list's names), a derived table, a table variable (its DECLARE ... TABLE
    columns), OPENJSON (its WITH columns, else key/value/type);
  * every @variable is a parameter of the procedure being created, DECLAREd earlier in the
    batch, or a bind parameter of the client call (`:name`, which the driver sends as a
    value); @@variables are allow-listed;
  * EXEC of a procedure: every named parameter is declared by the procedure, every
    parameter without a default is passed, no more positional arguments than parameters
    (one of the procedure's definitions, from any revision, must accept the whole call);
  * INSERT arity: the column list (or the target's insertable columns) against each VALUES
    row or the select list; OUTPUT ... INTO arity the same way;
  * a select list's aliases only in its ORDER BY; ROLLBACK TRANSACTION name only to a
    savepoint the batch SAVEs;
  * built-in functions by name, from an allow-list;
  * one sound type case: a literal no implicit conversion fits, in INSERT ... VALUES (with a
    column list) and UPDATE/MERGE SET (a string with a letter into a numeric column, a
    number into datetime2/date/time/datetimeoffset). Nothing else about types.

The catalogue is what the install script (`queuectl install --sql`) and the sections create:
CREATE TABLE with its columns and their types, CREATE SEQUENCE, CREATE [OR ALTER] PROCEDURE
with its parameters, CREATE INDEX. A queue kind's file and install script resolve against
that kind's own catalogue (its install script and its file's sections, today's and the
history's): kinds share object names but not their columns or parameters. The other files
(catalog, jobs, health, pipeline, grant, locks, storage, activation) serve every kind and
resolve against the union of all. A table's columns are the union of its definitions (a
revision may add one); a call must fit one whole definition of its procedure. Names compare
case-insensitively, without their quotes, as SQL Server's default collation does.

The allow-list's rule: a system object is accepted only if it is listed here, with the
columns (or parameters) the files use and a link to its Microsoft Learn page; nothing is
accepted for starting with `sys.`. A name neither created nor listed fails.

Not resolved, and counted as skipped (Coverage.skipped names each): the text of dynamic SQL
(`EXEC (N'...')`, `sp_executesql @sql`), and the result set of `INSERT ... EXEC` (its arity
depends on the procedure's last SELECT). Not checked at all: types beyond the literal case,
object permissions, and whether an object exists at the moment a batch runs (the catalogue
has no order).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field

from sqlfluff.core import FluffConfig, Linter

from queuectl.sqlfiles import split_go_batches

_LINTER = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")  # SQLAlchemy's bind-parameter pattern, as test_mssql_offline

# -- the allow-list of system objects --------------------------------------------------------
# Each entry is documented on Microsoft Learn (the link above it); the columns are those the
# T-SQL reads and a few of the same page's that sit beside them. A column or a view that is
# not here fails, even in schema sys.

_LEARN = "https://learn.microsoft.com/en-us/sql/relational-databases/"
_OBJECT_COLUMNS = {"name", "object_id", "principal_id", "schema_id", "parent_object_id", "type", "type_desc",
                   "create_date", "modify_date", "is_ms_shipped"}

SYSTEM_VIEWS: dict[str, set[str]] = {
    # _LEARN + system-catalog-views/sys-objects-transact-sql
    "sys.objects": _OBJECT_COLUMNS,
    # _LEARN + system-catalog-views/sys-sequences-transact-sql (sys.objects' columns and its own)
    "sys.sequences": _OBJECT_COLUMNS | {"start_value", "increment", "minimum_value", "maximum_value", "is_cycling",
                                        "is_cached", "cache_size", "current_value", "is_exhausted", "last_used_value"},
    # _LEARN + system-catalog-views/sys-indexes-transact-sql
    "sys.indexes": {"object_id", "name", "index_id", "type", "type_desc", "is_unique", "is_primary_key",
                    "fill_factor", "is_disabled", "is_hypothetical", "allow_row_locks", "allow_page_locks",
                    "has_filter", "filter_definition"},
    # _LEARN + system-catalog-views/sys-stats-transact-sql
    "sys.stats": {"object_id", "name", "stats_id", "auto_created", "user_created", "no_recompute", "has_filter"},
    # _LEARN + system-catalog-views/sys-types-transact-sql
    "sys.types": {"name", "system_type_id", "user_type_id", "schema_id", "is_user_defined", "is_table_type"},
    # _LEARN + system-catalog-views/sys-all-columns-transact-sql (a row source for numbers here)
    "sys.all_columns": {"object_id", "name", "column_id"},
    # _LEARN + system-catalog-views/sys-database-permissions-transact-sql
    "sys.database_permissions": {"class", "major_id", "minor_id", "grantee_principal_id", "grantor_principal_id",
                                 "type", "permission_name", "state", "state_desc"},
    # _LEARN + system-catalog-views/sys-databases-transact-sql
    "sys.databases": {"name", "database_id", "is_read_committed_snapshot_on", "snapshot_isolation_state",
                      "snapshot_isolation_state_desc", "compatibility_level"},
    # _LEARN + system-catalog-views/sys-index-resumable-operations
    "sys.index_resumable_operations": {"object_id", "index_id", "name", "sql_text", "state", "state_desc",
                                       "start_time", "last_pause_time", "percent_complete", "page_count"},
    # _LEARN + system-catalog-views/sys-availability-replicas-transact-sql
    "sys.availability_replicas": {"replica_id", "group_id", "replica_server_name", "endpoint_url",
                                  "availability_mode", "secondary_role_allow_connections"},
    # _LEARN + system-dynamic-management-views/sys-dm-db-partition-stats-transact-sql
    "sys.dm_db_partition_stats": {"partition_id", "object_id", "index_id", "partition_number", "in_row_data_page_count",
                                  "in_row_used_page_count", "used_page_count", "reserved_page_count", "row_count"},
    # _LEARN + system-dynamic-management-views/sys-dm-db-index-usage-stats-transact-sql
    "sys.dm_db_index_usage_stats": {"database_id", "object_id", "index_id", "user_seeks", "user_scans",
                                    "user_lookups", "user_updates", "last_user_seek", "last_user_scan"},
    # _LEARN + system-dynamic-management-views/sys-dm-exec-sessions-transact-sql
    "sys.dm_exec_sessions": {"session_id", "login_time", "host_name", "program_name", "login_name", "status",
                             "last_request_start_time", "last_request_end_time", "is_user_process",
                             "open_transaction_count", "database_id"},
    # _LEARN + system-dynamic-management-views/sys-dm-exec-requests-transact-sql
    "sys.dm_exec_requests": {"session_id", "request_id", "start_time", "status", "command", "sql_handle",
                             "database_id", "blocking_session_id", "wait_type", "wait_time", "transaction_id"},
    # _LEARN + system-dynamic-management-views/sys-dm-exec-connections-transact-sql
    "sys.dm_exec_connections": {"session_id", "most_recent_session_id", "connect_time", "client_net_address",
                                "client_tcp_port", "connection_id", "parent_connection_id", "most_recent_sql_handle"},
    # _LEARN + system-dynamic-management-views/sys-dm-tran-locks-transact-sql
    "sys.dm_tran_locks": {"resource_type", "resource_subtype", "resource_database_id", "resource_description",
                          "resource_associated_entity_id", "request_mode", "request_type", "request_status",
                          "request_session_id", "request_owner_type"},
    # _LEARN + system-dynamic-management-views/sys-dm-tran-session-transactions-transact-sql
    "sys.dm_tran_session_transactions": {"session_id", "transaction_id", "is_user_transaction", "is_local"},
    # _LEARN + system-dynamic-management-views/sys-dm-tran-active-transactions-transact-sql
    "sys.dm_tran_active_transactions": {"transaction_id", "name", "transaction_begin_time", "transaction_type",
                                        "transaction_uow", "transaction_state", "dtc_state"},
    # _LEARN + system-dynamic-management-views/sys-dm-tran-database-transactions-transact-sql
    "sys.dm_tran_database_transactions": {"transaction_id", "database_id", "database_transaction_begin_time",
                                          "database_transaction_type", "database_transaction_state",
                                          "database_transaction_log_record_count",
                                          "database_transaction_log_bytes_used"},
    # _LEARN + system-dynamic-management-views/sys-dm-tran-active-snapshot-database-transactions-transact-sql
    "sys.dm_tran_active_snapshot_database_transactions": {
        "transaction_id", "transaction_sequence_num", "commit_sequence_num", "session_id", "is_snapshot",
        "first_snapshot_sequence_num", "max_version_chain_traversed", "average_version_chain_traversed",
        "elapsed_time_seconds"},
    # _LEARN + system-dynamic-management-views/sys-dm-tran-version-store-space-usage
    "sys.dm_tran_version_store_space_usage": {"database_id", "reserved_page_count", "reserved_space_kb"},
    # _LEARN + system-dynamic-management-views/sys-dm-hadr-database-replica-states-transact-sql
    "sys.dm_hadr_database_replica_states": {"database_id", "group_id", "replica_id", "group_database_id", "is_local",
                                            "is_primary_replica", "synchronization_state",
                                            "synchronization_state_desc", "log_send_queue_size", "redo_queue_size",
                                            "low_water_mark_for_ghosts"},
    # _LEARN + system-dynamic-management-views/sys-dm-hadr-availability-replica-states-transact-sql
    # _LEARN + system-catalog-views/sys-check-constraints-transact-sql (sys.objects' columns and its own)
    "sys.check_constraints": _OBJECT_COLUMNS | {"is_disabled", "is_not_for_replication", "is_not_trusted",
                                                "parent_column_id", "definition", "uses_database_collation",
                                                "is_system_named"},
    "sys.dm_hadr_availability_replica_states": {"replica_id", "group_id", "is_local", "role", "role_desc",
                                                "connected_state", "connected_state_desc", "synchronization_health"},
}

# Table-valued system functions, with their result columns.
SYSTEM_TABLE_FUNCTIONS: dict[str, set[str]] = {
    # _LEARN + system-dynamic-management-views/sys-dm-db-index-physical-stats-transact-sql
    "sys.dm_db_index_physical_stats": {
        "database_id", "object_id", "index_id", "partition_number", "index_type_desc", "alloc_unit_type_desc",
        "index_depth", "index_level", "avg_fragmentation_in_percent", "fragment_count", "avg_fragment_size_in_pages",
        "page_count", "avg_page_space_used_in_percent", "record_count", "ghost_record_count",
        "version_ghost_record_count", "min_record_size_in_bytes", "max_record_size_in_bytes",
        "avg_record_size_in_bytes", "forwarded_record_count", "compressed_page_count"},
    # _LEARN + system-dynamic-management-views/sys-dm-db-index-operational-stats-transact-sql
    "sys.dm_db_index_operational_stats": {
        "database_id", "object_id", "index_id", "partition_number", "hobt_id", "leaf_insert_count",
        "leaf_delete_count", "leaf_update_count", "leaf_ghost_count", "nonleaf_insert_count",
        "nonleaf_delete_count", "nonleaf_update_count", "leaf_allocation_count", "nonleaf_allocation_count",
        "leaf_page_merge_count", "nonleaf_page_merge_count", "range_scan_count", "singleton_lookup_count",
        "row_lock_count", "row_lock_wait_count", "row_lock_wait_in_ms", "page_lock_count", "page_lock_wait_count",
        "page_lock_wait_in_ms", "index_lock_promotion_attempt_count", "index_lock_promotion_count"},
    # _LEARN + system-dynamic-management-views/sys-dm-exec-sql-text-transact-sql
    "sys.dm_exec_sql_text": {"dbid", "objectid", "number", "encrypted", "text"},
    # https://learn.microsoft.com/en-us/sql/t-sql/functions/openjson-transact-sql (without WITH;
    # OPENJSON ... WITH (...) has the columns it declares)
    "openjson": {"key", "value", "type"},
    # https://learn.microsoft.com/en-us/sql/t-sql/functions/string-split-transact-sql (compatibility
    # level 130+; the ordinal column only with its third argument, which queuectl does not pass)
    "string_split": {"value"},
}

# System stored procedures: parameter name -> has a default (may be left out). "*": takes
# further parameters of the caller's choosing (sp_executesql's statement parameters).
SYSTEM_PROCEDURES: dict[str, dict[str, bool]] = {
    # _LEARN + system-stored-procedures/sp-set-session-context-transact-sql
    "sys.sp_set_session_context": {"@key": False, "@value": False, "@read_only": True},
    # _LEARN + system-stored-procedures/sp-sequence-get-range-transact-sql
    "sys.sp_sequence_get_range": {"@sequence_name": False, "@range_size": False, "@range_first_value": False,
                                  "@range_last_value": True, "@range_cycle_count": True, "@sequence_increment": True,
                                  "@sequence_min_value": True, "@sequence_max_value": True},
    # _LEARN + system-stored-procedures/sp-getapplock-transact-sql
    "sys.sp_getapplock": {"@resource": False, "@lockmode": False, "@lockowner": True, "@locktimeout": True,
                          "@dbprincipal": True},
    # _LEARN + system-stored-procedures/sp-releaseapplock-transact-sql
    "sys.sp_releaseapplock": {"@resource": False, "@lockowner": True, "@dbprincipal": True},
    # _LEARN + system-stored-procedures/sp-executesql-transact-sql
    "sys.sp_executesql": {"@stmt": False, "@params": True, "*": True},
}

# Built-in scalar, aggregate and ranking functions.
# https://learn.microsoft.com/en-us/sql/t-sql/functions/functions
BUILTIN_FUNCTIONS: set[str] = {
    # conversion, logic, strings
    "cast", "convert", "try_cast", "try_convert", "coalesce", "isnull", "nullif", "iif", "choose",
    "concat", "concat_ws", "charindex", "left", "right", "len", "lower", "upper", "ltrim", "rtrim", "trim",
    "nchar", "replace", "replicate", "substring", "quotename", "string_agg", "format", "datalength", "hashbytes",
    # JSON
    "isjson", "json_value", "json_query", "json_modify",
    # math
    "abs", "ceiling", "floor", "power", "round", "sign", "sqrt",
    # date and time
    "dateadd", "datediff", "datediff_big", "datepart", "getdate", "getutcdate", "sysdatetime",
    "sysutcdatetime", "sysdatetimeoffset",
    # aggregates and ranking
    "count", "count_big", "sum", "min", "max", "avg", "percentile_cont", "row_number", "rank", "dense_rank",
    # metadata and security
    "object_id", "object_name", "object_schema_name", "objectproperty", "schema_id", "schema_name", "db_id",
    "db_name", "current_transaction_id",
    "databasepropertyex", "serverproperty", "stats_date", "has_perms_by_name", "database_principal_id",
    "session_context", "newid", "error_message", "error_number", "xact_state",
}

# System data types. https://learn.microsoft.com/en-us/sql/t-sql/data-types/data-types-transact-sql
BUILTIN_TYPES: set[str] = {
    "bigint", "int", "smallint", "tinyint", "bit", "decimal", "numeric", "money", "smallmoney", "float", "real",
    "date", "time", "datetime2", "datetimeoffset", "datetime", "smalldatetime", "char", "varchar", "nchar",
    "nvarchar", "binary", "varbinary", "uniqueidentifier", "xml", "sysname", "sql_variant", "rowversion",
    "integer", "dec",  # ISO synonyms of int and decimal (SQLAlchemy's DDL writes INTEGER)
}

# https://learn.microsoft.com/en-us/sql/t-sql/functions/configuration-functions-transact-sql
# and .../rowcount-transact-sql, .../trancount-transact-sql, .../procid-transact-sql
SYSTEM_VARIABLES: set[str] = {"@@rowcount", "@@spid", "@@procid", "@@trancount", "@@error", "@@version"}


_NUMERIC_TYPES = {"bigint", "int", "smallint", "tinyint", "bit", "float", "real", "decimal", "numeric", "money",
                  "smallmoney"}
# https://learn.microsoft.com/en-us/sql/t-sql/data-types/data-type-conversion-database-engine
# (the conversion chart: int, decimal, float... to datetime2, date, time, datetimeoffset: not allowed)
_NUMBERLESS_TIME_TYPES = {"datetime2", "date", "time", "datetimeoffset"}


class RefError(AssertionError):
    pass


@dataclass
class Coverage:
    """What the check resolved, by kind of name, and what it could not resolve (skipped)."""

    resolved: Counter = field(default_factory=Counter)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: Coverage) -> None:
        self.resolved.update(other.resolved)
        self.skipped.extend(other.skipped)


# -- names -------------------------------------------------------------------------------------

_IDENT_TYPES = ("naked_identifier", "quoted_identifier", "function_name_identifier", "keyword")


def _ident(raw: str) -> str:
    raw = raw.strip()
    if raw[:1] in ('"', "[") and raw[-1:] in ('"', "]"):
        raw = raw[1:-1]
    return raw.lower()


def _code(seg) -> list:
    return [c for c in seg.segments if c.is_code]


def _parts(seg) -> tuple[str, ...]:
    """The dotted name of a reference segment, each part unquoted and lower case."""
    parts = [_ident(c.raw) for c in seg.segments if c.is_type(*_IDENT_TYPES, "parameter", "hash_identifier")]
    return tuple(parts) if parts else (_ident(seg.raw),)


def _literal_name(raw: str) -> tuple[str, ...] | None:
    """A quoted object name passed as a string ('"queuectl"."orders_ring"'), as its parts."""
    text = raw[1:] if raw[:1] in "Nn" else raw
    text = text[1:-1].replace("''", "'")
    parts = re.findall(r'"([^"]+)"|\[([^\]]+)\]|([^."\[\]]+)', text)
    return tuple((a or b or c).strip().lower() for a, b, c in parts) or None


def _key(parts: tuple[str, ...]) -> str:
    return ".".join(parts)


# -- the catalogue ----------------------------------------------------------------------------


@dataclass
class Table:
    columns: set[str] = field(default_factory=set)
    types: dict[str, set[str]] = field(default_factory=dict)  # column -> base type names (of any definition)
    insertable: set[int] = field(default_factory=set)  # per definition: columns an INSERT without a list fills


@dataclass
class Catalogue:
    tables: dict[str, Table] = field(default_factory=dict)
    sequences: set[str] = field(default_factory=set)
    procedures: dict[str, list[dict[str, bool]]] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)
    indexes: set[str] = field(default_factory=set)
    schemas: set[str] = field(default_factory=set)

    def find(self, kind: str, parts: tuple[str, ...]) -> str | None:
        """The key of a created object of one kind named by parts (schema optional)."""
        found = getattr(self, kind)
        key = _key(parts)
        if key in found:
            return key
        if len(parts) == 1:
            matches = [k for k in found if k.rsplit(".", 1)[-1] == parts[0]]
            return matches[0] if len(matches) == 1 else None
        return None

    def learn(self, tree) -> None:
        for seg in tree.recursive_crawl("create_table_statement"):
            name = next(c for c in seg.segments if c.is_type("table_reference", "object_reference"))
            key = _key(_parts(name))
            table = self.tables.setdefault(key, Table())
            body = next(c for c in seg.segments if c.is_type("bracketed"))
            insertable = 0
            for column in body.segments:
                if column.is_type("column_definition"):
                    table.columns.add(_ident(_code(column)[0].raw))
                    table.types.setdefault(_ident(_code(column)[0].raw), set()).add(_base_type(column))
                    if not any(True for _ in column.recursive_crawl("identity_grammar")):
                        insertable += 1
            table.insertable.add(insertable)
            if len(_parts(name)) > 1:
                self.schemas.add(_parts(name)[0])
        for seg in tree.recursive_crawl("alter_table_statement"):
            # ALTER TABLE ... ADD <column definitions>: a revision adds columns to a table
            added = [c for c in seg.segments if c.is_type("column_definition")]
            if not added:
                continue
            name = next(c for c in seg.segments if c.is_type("table_reference", "object_reference"))
            table = self.tables.setdefault(_key(_parts(name)), Table())
            for column in added:
                table.columns.add(_ident(_code(column)[0].raw))
                table.types.setdefault(_ident(_code(column)[0].raw), set()).add(_base_type(column))
            table.insertable |= {width + len(added) for width in table.insertable}
        for seg in tree.recursive_crawl("create_sequence_statement"):
            self.sequences.add(_key(_parts(next(c for c in seg.segments if c.is_type("object_reference")))))
        for seg in tree.recursive_crawl("create_procedure_statement"):
            name = _key(_parts(next(c for c in seg.segments if c.is_type("object_reference"))))
            self.procedures.setdefault(name, []).append(_signature(seg))
        for seg in tree.recursive_crawl("create_function_statement"):
            self.functions.add(_key(_parts(next(c for c in seg.segments if c.is_type("object_reference")))))
        for seg in tree.recursive_crawl("create_index_statement"):
            self.indexes.add(_key(_parts(next(c for c in seg.segments if c.is_type("index_reference")))))


def _base_type(column_definition) -> str:
    """A column definition's type name without its length ("nvarchar(400)" -> "nvarchar")."""
    data_type = next((c for c in column_definition.segments if c.is_type("data_type")), None)
    return _ident(_code(data_type)[0].raw) if data_type is not None and _code(data_type) else ""


def _signature(procedure) -> dict[str, bool]:
    """A procedure's parameters: name -> has a default."""
    params: dict[str, bool] = {}
    for plist in procedure.segments:
        if not plist.is_type("procedure_parameter_list"):
            continue
        current = None
        for c in _code(plist):
            if c.is_type("parameter"):
                current = c.raw.lower()
                params[current] = False
            elif c.is_type("comparison_operator") and current:
                params[current] = True
    return params


@functools.cache
def _tree(text: str):
    parsed = _LINTER.parse_string(text)
    if parsed.violations or parsed.tree is None:
        raise RefError(f"does not parse: {parsed.violations}\n{text}")
    return parsed.tree


def _prepare(batch: str) -> tuple[str, frozenset[str]]:
    """The batch as the parser reads it (binds as @variables) and its bind names."""
    binds = frozenset("@" + b.lower() for b in _BIND.findall(batch))
    return _BIND.sub(r"@\1", batch), binds


def build_catalogue(scripts: list[str]) -> Catalogue:
    cat = Catalogue()
    for script in scripts:
        for batch in split_go_batches(script):
            cat.learn(_tree(_prepare(batch)[0]))
    return cat


# -- scopes -------------------------------------------------------------------------------------


@dataclass
class Source:
    what: str  # for messages
    columns: set[str]
    insertable: set[int] = field(default_factory=set)  # widths an INSERT without a column list fills
    types: dict[str, set[str]] = field(default_factory=dict)


class Scope:
    def __init__(self, parent: Scope | None = None):
        self.parent = parent
        self.sources: dict[str, Source] = {}
        self.ctes: dict[str, Source] = {}
        self.select_aliases: set[str] = set()

    def add(self, names: list[tuple[str, ...]], source: Source) -> None:
        for name in names:
            self.sources[_key(name)] = source
            self.sources[name[-1]] = source

    def source(self, qualifier: tuple[str, ...]) -> Source | None:
        scope = self
        while scope is not None:
            if _key(qualifier) in scope.sources:
                return scope.sources[_key(qualifier)]
            scope = scope.parent
        return None

    def cte(self, name: str) -> Source | None:
        scope = self
        while scope is not None:
            if name in scope.ctes:
                return scope.ctes[name]
            scope = scope.parent
        return None


# -- the check --------------------------------------------------------------------------------


class _Batch:
    def __init__(self, cat: Catalogue, tree, binds: frozenset[str]):
        self.cat = cat
        self.tree = tree
        self.problems: list[str] = []
        self.coverage = Coverage()
        # variables: name -> (declared at, table columns or None)
        self.variables: dict[str, tuple[int, Source | None]] = {b: (-1, None) for b in binds}
        self._declare_all()

    # variables -----------------------------------------------------------------------------

    def _declare_all(self) -> None:
        for plist in self.tree.recursive_crawl("procedure_parameter_list"):
            for c in _code(plist):
                if c.is_type("parameter"):
                    self.variables[c.raw.lower()] = (-1, None)
        for declare in self.tree.recursive_crawl("declare_segment"):
            children = _code(declare)
            for i, c in enumerate(children):
                if not c.is_type("parameter"):
                    continue
                source = None
                rest = children[i + 1:i + 3]
                if rest and rest[0].raw.upper() == "TABLE":
                    definitions = [d for d in rest[1].segments if d.is_type("column_definition")]
                    source = Source(f"table variable {c.raw}", {_ident(_code(d)[0].raw) for d in definitions},
                                    {sum(1 for d in definitions if not any(True for _ in d.recursive_crawl("identity_grammar")))},
                                    {_ident(_code(d)[0].raw): {_base_type(d)} for d in definitions})
                self.variables[c.raw.lower()] = (_at(c), source)

    def use_variable(self, seg) -> Source | None:
        name = seg.raw.lower()
        declared = self.variables.get(name)
        if declared is None:
            self.problems.append(f"undeclared variable {seg.raw}")
            return None
        if declared[0] > _at(seg):
            self.problems.append(f"variable {seg.raw} used before its DECLARE")
        self.coverage.resolved["variable"] += 1
        return declared[1]

    # walking -------------------------------------------------------------------------------

    def run(self) -> None:
        self.visit(self.tree, Scope())

    def visit(self, seg, scope: Scope):
        handler = getattr(self, "v_" + seg.get_type(), None)
        if handler is not None:
            return handler(seg, scope)
        for child in seg.segments:
            self.visit(child, scope)
        return None

    def visit_all(self, segs, scope: Scope) -> None:
        for s in segs:
            self.visit(s, scope)

    def v_parameter(self, seg, scope):
        self.use_variable(seg)

    def v_data_type(self, seg, scope):
        """A system type, its arguments integers or max (nvarchar(max), datetime2(6))."""
        code = _code(seg)
        name = _ident(code[0].raw)
        if name not in BUILTIN_TYPES:
            self.problems.append(f"unknown data type {code[0].raw}")
            return
        self.coverage.resolved["data type"] += 1
        for argument in (a for c in code[1:] for a in c.recursive_crawl("bracketed", recurse_into=False)):
            for value in _code(argument):
                while value.is_type("expression") and len(_code(value)) == 1:
                    value = _code(value)[0]
                if not (value.is_type("start_bracket", "end_bracket", "comma", "integer_literal", "numeric_literal")
                        or value.raw.lower() == "max"):
                    self.problems.append(f"data type {seg.raw}: argument {value.raw!r}")

    def v_system_variable(self, seg, scope):
        if seg.raw.lower() in SYSTEM_VARIABLES:
            self.coverage.resolved["system variable"] += 1
        else:
            self.problems.append(f"unknown system variable {seg.raw}")

    # columns -------------------------------------------------------------------------------

    def v_column_reference(self, seg, scope):
        self.resolve_column(_parts(seg), scope, seg.raw)

    def resolve_column(self, parts: tuple[str, ...], scope: Scope, raw: str) -> None:
        if len(parts) > 1:
            source = scope.source(parts[:-1])
            if source is None:
                self.problems.append(f"column {raw}: no table or alias {'.'.join(parts[:-1])!r} in scope")
            elif parts[-1] not in source.columns:
                self.problems.append(f"column {raw}: {source.what} has no column {parts[-1]!r}")
            else:
                self.coverage.resolved["column"] += 1
            return
        column = parts[0]
        level = scope
        while level is not None:
            holders = {id(s): s for s in level.sources.values() if column in s.columns}
            if len(holders) > 1:
                self.problems.append(f"column {raw} is ambiguous: in {sorted(s.what for s in holders.values())}")
                return
            if holders or column in level.select_aliases:
                self.coverage.resolved["column"] += 1
                return
            level = level.parent
        self.problems.append(f"column {raw}: no source in scope has it")

    def check_columns(self, refs, source: Source) -> int:
        """Column names of a list (INSERT, OUTPUT INTO, index keys) against one source."""
        n = 0
        for ref in refs:
            name = _parts(ref)[-1] if ref.is_type("column_reference") else _ident(_code(ref)[0].raw if _code(ref) else ref.raw)
            n += 1
            if name not in source.columns:
                self.problems.append(f"column {ref.raw}: {source.what} has no column {name!r}")
            else:
                self.coverage.resolved["column"] += 1
        return n

    # objects -------------------------------------------------------------------------------

    def table(self, ref, scope: Scope) -> Source | None:
        """The source a table_reference names: table variable, CTE, catalogue table, system view."""
        parts = _parts(ref)
        if ref.segments and ref.segments[0].is_type("parameter"):
            source = self.use_variable(ref.segments[0])
            if source is None and ref.segments[0].raw.lower() in self.variables:
                self.problems.append(f"{ref.raw} is not a table variable")
            return source
        if len(parts) == 1 and scope.cte(parts[0]) is not None:
            self.coverage.resolved["cte"] += 1
            return scope.cte(parts[0])
        key = self.cat.find("tables", parts)
        if key is not None:
            self.coverage.resolved["table"] += 1
            table = self.cat.tables[key]
            return Source(f"table {key}", table.columns, table.insertable, table.types)
        if _key(parts) in SYSTEM_VIEWS:
            self.coverage.resolved["system view"] += 1
            return Source(_key(parts), SYSTEM_VIEWS[_key(parts)])
        self.problems.append(f"unknown table {ref.raw}")
        return None

    def object(self, ref, kinds: tuple[str, ...], what: str) -> str | None:
        parts = _parts(ref) if not isinstance(ref, tuple) else ref
        raw = ref.raw if not isinstance(ref, tuple) else _key(ref)
        for kind in kinds:
            key = self.cat.find(kind, parts)
            if key is not None:
                self.coverage.resolved[what] += 1
                return key
        self.problems.append(f"unknown {what} {raw}")
        return None

    def v_table_reference(self, seg, scope):
        self.table(seg, scope)

    def v_object_reference(self, seg, scope):
        self.object(seg, ("tables", "procedures", "sequences", "functions", "indexes", "schemas"), "object")

    def v_sequence_next_value(self, seg, scope):
        for c in seg.segments:
            if c.is_type("object_reference"):
                self.object(c, ("sequences",), "sequence")
            else:
                self.visit(c, scope)

    # queries -------------------------------------------------------------------------------

    def v_with_compound_statement(self, seg, scope):
        inner = Scope(scope)
        result = None
        for c in seg.segments:
            if c.is_type("common_table_expression"):
                code = _code(c)
                name = _ident(code[0].raw)
                body = next(x for x in code if x.is_type("bracketed"))
                listed = [x for x in code[1:] if x.is_type("cte_column_list", "bracketed") and x is not body]
                outputs = self.query_in(body, inner)
                columns = [_ident(i.raw) for x in listed for i in x.recursive_crawl("naked_identifier", "quoted_identifier")] or outputs
                inner.ctes[name] = Source(f"CTE {name}", set(columns))
                self.coverage.resolved["cte definition"] += 1
            elif c.is_code and not c.is_type("keyword", "comma"):
                result = self.visit(c, inner)
        return result

    def query_in(self, bracketed, scope) -> list[str]:
        """The output names of the query inside brackets."""
        for c in bracketed.segments:
            if c.is_type("select_statement", "set_expression", "with_compound_statement"):
                return self.visit(c, scope) or []
            if c.is_type("bracketed"):
                return self.query_in(c, scope)
        self.problems.append(f"no query in {bracketed.raw[:60]!r}")
        return []

    def v_set_expression(self, seg, scope):
        outputs = None
        for c in seg.segments:
            if c.is_type("select_statement", "bracketed", "with_compound_statement"):
                got = self.visit(c, scope) if not c.is_type("bracketed") else self.query_in(c, scope)
                outputs = got if outputs is None else outputs
            elif c.is_type("orderby_clause"):
                ordering = Scope(scope)
                ordering.select_aliases = {o for o in outputs or [] if o}
                self.visit(c, ordering)
        return outputs or []

    def v_select_statement(self, seg, scope):
        local = Scope(scope)
        for c in seg.segments:
            if c.is_type("from_clause"):
                self.from_clause(c, local)
        outputs: list[str] = []
        for c in seg.segments:
            if c.is_type("select_clause"):
                outputs = self.select_clause(c, local)
            elif c.is_type("from_clause"):
                continue
            elif c.is_type("orderby_clause"):  # the one clause that sees the select list's names
                ordering = Scope(local)
                ordering.select_aliases = {o for o in outputs if o}
                self.visit(c, ordering)
            elif c.is_type("into_table_clause"):
                self.problems.append("SELECT ... INTO is not resolved")
            else:
                self.visit(c, local)
        return outputs

    def select_clause(self, clause, scope) -> list[str]:
        outputs: list[str] = []
        for c in clause.segments:
            if not c.is_type("select_clause_element"):
                self.visit(c, scope)
                continue
            code = _code(c)
            alias = next((x for x in code if x.is_type("alias_expression")), None)
            self.visit_all([x for x in code if x is not alias], scope)
            if alias is not None:
                outputs.append(_ident(_code(alias)[-1].raw))
            elif code[0].is_type("select_variable_assignment"):
                outputs.append("")
            elif code[0].is_type("column_reference"):
                outputs.append(_parts(code[0])[-1])
            elif code[0].is_type("wildcard_expression"):
                star = _code(code[0])[0]
                qualifier = tuple(_ident(x.raw) for x in star.segments if x.is_type("naked_identifier", "quoted_identifier"))
                if qualifier:
                    source = scope.source(qualifier)
                    outputs.extend(sorted(source.columns) if source else [])
                else:
                    seen = {id(s): s for s in scope.sources.values()}
                    outputs.extend(c for s in seen.values() for c in sorted(s.columns))
            else:
                outputs.append("")
        return outputs

    def from_clause(self, clause, scope: Scope) -> None:
        """Add the sources of a FROM clause to scope, in order (APPLY sees the earlier ones)."""
        conditions = []
        for element in clause.recursive_crawl("from_expression_element", "join_on_condition",
                                              no_recursive_seg_type=("select_statement", "set_expression")):
            if element.is_type("join_on_condition"):
                conditions.append(element)
            else:
                self.from_element(element, scope)
        self.visit_all(conditions, scope)

    def from_element(self, element, scope: Scope) -> None:
        code = _code(element)
        alias_seg = next((x for x in code if x.is_type("alias_expression")), None)
        alias = None
        listed: list[str] = []
        if alias_seg is not None:
            names = [x for x in _code(alias_seg) if x.is_type("naked_identifier", "quoted_identifier")]
            alias = _ident(names[0].raw) if names else None
            listed = [_ident(i.raw) for x in alias_seg.recursive_crawl("alias_column_list")
                      for i in x.recursive_crawl("naked_identifier", "quoted_identifier")]
        expression = next(x for x in code if x.is_type("table_expression", "bracketed"))
        inner = _code(expression)[0] if expression.is_type("table_expression") else expression
        names: list[tuple[str, ...]] = []
        source: Source | None
        if inner.is_type("table_reference"):
            source = self.table(inner, scope)
            names.append(_parts(inner))
        elif inner.is_type("bracketed") and any(True for _ in inner.recursive_crawl("values_clause", no_recursive_seg_type="select_statement")):
            self.visit(inner, scope)  # VALUES (...), (...) AS v (columns)
            source = Source(f"VALUES {alias}", set())
        elif inner.is_type("bracketed"):
            source = Source(f"derived table {alias}", set(self.query_in(inner, scope)))
        elif inner.is_type("openjson_segment"):
            source = self.openjson(inner, scope)
        elif inner.is_type("function"):
            source = self.table_function(inner, scope)
        elif inner.is_type("values_clause"):
            self.visit(inner, scope)
            source = Source(f"VALUES {alias}", set())
        else:
            self.problems.append(f"unknown FROM item {inner.get_type()}: {inner.raw[:60]!r}")
            source = None
        for x in code:
            if x.is_type("post_table_expression"):
                self.visit(x, scope)
        if source is None:
            source = Source(f"unresolved {inner.raw[:40]}", set())
        if listed:
            source = Source(source.what, set(listed))
        if alias is not None:
            names = [(alias,)]
        scope.add(names, source)

    def openjson(self, seg, scope) -> Source:
        columns = {"key", "value", "type"}
        for c in seg.segments:
            if c.is_type("openjson_with_clause"):
                body = next(x for x in c.segments if x.is_type("bracketed"))
                columns = {_ident(x.raw) for x in body.segments if x.is_type("naked_identifier", "quoted_identifier")}
                self.visit_all([x for x in body.segments if x.is_type("data_type")], scope)
            else:
                self.visit(c, scope)
        self.coverage.resolved["system function"] += 1
        return Source("OPENJSON", columns)

    def table_function(self, seg, scope) -> Source | None:
        name = _key(self.function_name(seg))
        self.visit_all([c for c in seg.segments if c.is_type("function_contents")], scope)
        if name in SYSTEM_TABLE_FUNCTIONS:
            self.coverage.resolved["system function"] += 1
            return Source(name, SYSTEM_TABLE_FUNCTIONS[name])
        self.problems.append(f"unknown table-valued function {name}")
        return None

    # functions -----------------------------------------------------------------------------

    @staticmethod
    def function_name(seg) -> tuple[str, ...]:
        name = next(c for c in seg.segments if c.is_type("function_name"))
        return tuple(_ident(c.raw) for c in name.segments if c.is_type(*_IDENT_TYPES))

    def v_function(self, seg, scope):
        name = self.function_name(seg)
        key = _key(name)
        if len(name) == 1 and key in BUILTIN_FUNCTIONS:
            self.coverage.resolved["built-in function"] += 1
        elif self.cat.find("functions", name) is not None:
            self.coverage.resolved["function"] += 1
        else:
            self.problems.append(f"unknown function {key}")
        contents = [c for c in seg.segments if not c.is_type("function_name")]
        if key == "object_id":  # OBJECT_ID(N'"schema"."name"'): the name is in the string
            brackets = next(c for c in contents if c.is_type("function_contents")).segments[0]
            first = next((c for c in _code(brackets) if not c.is_type("start_bracket")), None)
            first = _code(first)[0] if first is not None and first.is_type("expression") and len(_code(first)) == 1 else first
            if first is not None and first.is_type("quoted_literal"):
                self.named_in_string(first, ("tables", "sequences", "procedures", "functions"), "object")
        self.visit_all(contents, scope)

    def named_in_string(self, literal, kinds, what) -> None:
        parts = _literal_name(literal.raw)
        if parts:
            self.object(parts, kinds, what)

    # DML -----------------------------------------------------------------------------------

    def dml_target(self, ref, scope: Scope) -> Source | None:
        """The target of UPDATE/DELETE/INSERT/MERGE: an alias of the FROM, a CTE, a table."""
        parts = _parts(ref)
        if len(parts) == 1 and parts[0] in scope.sources and not ref.segments[0].is_type("parameter"):
            self.coverage.resolved["alias"] += 1
            return scope.sources[parts[0]]
        source = self.table(ref, scope)
        if source is not None:
            scope.add([parts], source)
        return source

    def set_clauses(self, clauses, target: Source | None, scope: Scope) -> None:
        for clause in clauses.segments:
            if not clause.is_type("set_clause"):
                self.visit(clause, scope)
                continue
            code = _code(clause)
            if code[0].is_type("column_reference") and target is not None:
                self.check_columns([code[0]], target)
                self.check_type(target, _parts(code[0])[-1], code[-1])
                rest = code[1:]
            else:
                rest = code
            self.visit_all(rest, scope)

    def output(self, clause, target: Source | None, scope: Scope) -> None:
        """OUTPUT inserted.x / deleted.x / other columns [INTO target (columns)]."""
        code = _code(clause)[1:]
        if any(c.raw.upper() == "INTO" for c in code):
            at = next(i for i, c in enumerate(code) if c.raw.upper() == "INTO")
            listed, into = code[:at], code[at + 1:]
        else:
            listed, into = code, []
        count = 0
        groups: list[list] = [[]]
        for c in listed:
            if c.is_type("comma"):
                groups.append([])
            else:
                groups[-1].append(c)
        for group in groups:
            if not group:
                continue
            count += 1
            qualified = len(group) >= 3 and group[1].is_type("dot") and group[0].is_type("naked_identifier", "quoted_identifier")
            if qualified and _ident(group[2].raw) != "*":  # d.payload: the parser leaves OUTPUT's items flat
                self.resolve_column((_ident(group[0].raw), _ident(group[2].raw)), scope, "".join(g.raw for g in group[:3]))
                self.visit_all(group[3:], scope)
            elif group[0].raw.lower() in ("inserted", "deleted") and len(group) >= 3 and group[1].is_type("dot"):
                column = _ident(group[2].raw)
                if target is None:
                    pass
                elif group[2].raw == "*":
                    self.coverage.resolved["column"] += 1
                elif column not in target.columns:
                    self.problems.append(f"OUTPUT {group[0].raw}.{group[2].raw}: {target.what} has no column {column!r}")
                else:
                    self.coverage.resolved["column"] += 1
                self.visit_all(group[3:], scope)
            else:
                self.visit_all(group, scope)
        if into:
            destination = into[0]
            if destination.is_type("parameter"):
                source = self.use_variable(destination)
                if source is None and destination.raw.lower() in self.variables:
                    self.problems.append(f"OUTPUT INTO {destination.raw}: not a table variable")
            else:
                source = self.table(destination, scope)
            columns = [c for b in into[1:] if b.is_type("bracketed") for c in _code(b) if c.is_type("column_reference")]
            if source is not None:
                width = self.check_columns(columns, source) if columns else None
                self.arity(f"OUTPUT INTO {destination.raw}", width, source, count)

    def arity(self, what: str, width: int | None, target: Source, count: int) -> None:
        """The values' count against the column list, or the target's insertable columns."""
        widths = {width} if width is not None else target.insertable
        if not widths:
            self.coverage.skipped.append((what, "the target's width is unknown"))
        elif count not in widths:
            self.problems.append(f"{what}: {count} values for {' or '.join(map(str, sorted(widths)))} columns")
        else:
            self.coverage.resolved["arity"] += 1

    def check_type(self, target: Source, column: str, value) -> None:
        """The one type check, and a sound one: a literal that no implicit conversion turns into
        the column's type (SQL Server fails the statement when it runs). A string with a letter
        into a numeric column (error 245/8114; '', '12', '1e3' or '$1,000' may convert, so they
        pass); a number into datetime2/date/time/datetimeoffset (error 206, operand type
        clash; datetime and smalldatetime take numbers)."""
        while value.is_type("expression") and len(_code(value)) == 1:
            value = _code(value)[0]
        types = target.types.get(column)
        if not types or "" in types:
            return
        if value.is_type("quoted_literal") and types <= _NUMERIC_TYPES:
            text = value.raw[1:] if value.raw[:1] in "Nn" else value.raw
            if re.search(r"[^\d\s.+\-eE$,]", text[1:-1]):
                self.problems.append(f"type mismatch: {value.raw} into {column} ({'/'.join(sorted(types))}) of {target.what}")
                return
        if value.is_type("numeric_literal", "integer_literal") and types <= _NUMBERLESS_TIME_TYPES:
            self.problems.append(f"type mismatch: {value.raw} into {column} ({'/'.join(sorted(types))}) of {target.what}")
            return
        if value.is_type("quoted_literal", "numeric_literal", "integer_literal"):
            self.coverage.resolved["literal type"] += 1

    def v_update_statement(self, seg, scope):
        local = Scope(scope)
        for c in seg.segments:
            if c.is_type("from_clause"):
                self.from_clause(c, local)
        target = None
        for c in seg.segments:
            if c.is_type("table_reference") and target is None:
                target = self.dml_target(c, local)
            elif c.is_type("set_clause_list"):
                self.set_clauses(c, target, local)
            elif c.is_type("output_clause"):
                self.output(c, target, local)
            elif not c.is_type("from_clause"):
                self.visit(c, local)

    def v_delete_statement(self, seg, scope):
        local = Scope(scope)
        for c in seg.segments:
            if c.is_type("from_clause"):
                self.from_clause(c, local)
        target = None
        for c in seg.segments:
            if c.is_type("table_reference") and target is None:
                target = self.dml_target(c, local)
            elif c.is_type("output_clause"):
                self.output(c, target, local)
            elif not c.is_type("from_clause"):
                self.visit(c, local)

    def v_insert_statement(self, seg, scope):
        target, target_ref, width, names = None, None, None, []
        for c in seg.segments:
            if c.is_type("table_reference") and target_ref is None:
                target_ref = c
                target = self.table(c, scope)
            elif c.is_type("bracketed") and target_ref is not None and width is None:
                columns = [x for x in _code(c) if x.is_type("column_reference")]
                width = self.check_columns(columns, target) if target is not None else len(columns)
                names = [_parts(x)[-1] for x in columns]
            elif c.is_type("output_clause"):
                self.output(c, target, scope)
            elif c.is_type("values_clause"):
                for row in (x for x in c.segments if x.is_type("bracketed")):
                    values = [x for x in _code(row) if not x.is_type("comma", "start_bracket", "end_bracket")]
                    self.visit(row, scope)
                    if target is not None:
                        self.arity(f"INSERT INTO {target_ref.raw}", width, target, len(values))
                        for name, value in zip(names, values):
                            self.check_type(target, name, value)
            elif c.is_type("select_statement", "set_expression", "with_compound_statement"):
                outputs = self.visit(c, scope)
                if target is not None and outputs is not None:
                    self.arity(f"INSERT INTO {target_ref.raw} SELECT", width, target, len(outputs))
            elif c.is_type("execute_script_statement"):
                self.visit(c, scope)
                self.coverage.skipped.append((f"INSERT INTO {target_ref.raw} EXEC", "a procedure's result set"))
            else:
                self.visit(c, scope)

    def v_merge_statement(self, seg, scope):
        local = Scope(scope)
        code = _code(seg)
        target = None
        i = 0
        while i < len(code):
            c = code[i]
            nxt = code[i + 1] if i + 1 < len(code) else None
            if c.is_type("table_reference") and target is None:
                target = self.table(c, local)
                names = [_parts(c)]
                j = i + 1
                while j < len(code) and not code[j].is_type("alias_expression") and code[j].raw.upper() != "USING":
                    j += 1
                if j < len(code) and code[j].is_type("alias_expression"):
                    names = [(_ident(_code(code[j])[-1].raw),)]
                if target is not None:
                    local.add(names, target)
            elif c.raw.upper() == "USING" and nxt is not None:
                if nxt.is_type("bracketed"):
                    source = Source("MERGE source", set(self.query_in(nxt, local)))
                else:
                    source = self.table(nxt, local) or Source("MERGE source", set())
                alias_seg = code[i + 2] if i + 2 < len(code) and code[i + 2].is_type("alias_expression") else None
                names = [(_ident(_code(alias_seg)[-1].raw),)] if alias_seg else [_parts(nxt)]
                local.add(names, source)
                i += 2
            elif c.is_type("merge_match"):
                self.merge_match(c, target, local)
            elif not c.is_type("alias_expression", "bracketed"):
                self.visit(c, local)
            i += 1

    def merge_match(self, seg, target, scope) -> None:
        for c in seg.segments:
            if c.is_type("merge_update_clause"):
                for x in c.segments:
                    if x.is_type("set_clause_list"):
                        self.set_clauses(x, target, scope)
                    else:
                        self.visit(x, scope)
            elif c.is_type("merge_insert_clause"):
                width = None
                for x in c.segments:
                    if x.is_type("bracketed") and width is None:
                        columns = [r for r in _code(x) if r.is_type("column_reference")]
                        width = self.check_columns(columns, target) if target else len(columns)
                    elif x.is_type("values_clause"):
                        for row in (r for r in x.segments if r.is_type("bracketed")):
                            values = [r for r in _code(row) if not r.is_type("comma", "start_bracket", "end_bracket")]
                            self.visit(row, scope)
                            if width is not None and len(values) != width:
                                self.problems.append(f"MERGE INSERT: {len(values)} values for {width} columns")
                            else:
                                self.coverage.resolved["arity"] += 1
                    else:
                        self.visit(x, scope)
            elif c.is_type("merge_when_matched_clause", "merge_when_not_matched_clause"):
                self.merge_match(c, target, scope)
            else:
                self.visit(c, scope)

    # procedures ----------------------------------------------------------------------------

    def v_execute_script_statement(self, seg, scope):
        code = _code(seg)[1:]  # after EXEC
        if code and code[0].is_type("parameter") and len(code) > 2 and code[1].is_type("comparison_operator", "raw_comparison_operator"):
            self.use_variable(code[0])  # EXEC @rc = procedure
            code = code[2:]
        if not code:
            return
        head, args = code[0], code[1:]
        if head.is_type("bracketed"):
            self.visit(head, scope)
            self.coverage.skipped.append((f"EXEC {head.raw[:60]}", "dynamic SQL text"))
            return
        name = _parts(head)
        key = _key(name)
        signatures = None
        if key in SYSTEM_PROCEDURES or ("sys." + key) in SYSTEM_PROCEDURES:
            signatures = [SYSTEM_PROCEDURES.get(key) or SYSTEM_PROCEDURES["sys." + key]]
            self.coverage.resolved["system procedure"] += 1
            if key.endswith("sp_executesql"):
                self.coverage.skipped.append((seg.raw[:60], "dynamic SQL text"))
        else:
            found = self.object(head, ("procedures",), "procedure")
            signatures = self.cat.procedures[found] if found else None
        named: list[tuple[str, object]] = []
        positional = 0
        groups: list[list] = [[]]
        for c in args:
            if c.is_type("comma"):
                groups.append([])
            else:
                groups[-1].append(c)
        for group in groups:
            if not group:
                continue
            if group[0].is_type("parameter") and len(group) > 1 and group[1].is_type("comparison_operator"):
                named.append((group[0].raw.lower(), group[0]))
                values = group[2:]
            else:
                positional += 1
                values = group
            for v in values:
                literal = _code(v)[0] if v.is_type("expression") and len(_code(v)) == 1 else v
                if (literal.is_type("quoted_literal") and named and named[-1][0] == "@sequence_name"
                        and key.endswith("sp_sequence_get_range") and group[0] is named[-1][1]):
                    self.named_in_string(literal, ("sequences",), "sequence")
                if not v.is_type("keyword"):  # OUTPUT
                    self.visit(v, scope)
        if signatures is None:
            return
        problems = []
        for signature in signatures:
            params = list(signature)
            wrong = [raw.raw for name, raw in named if name not in signature and "*" not in signature]
            params = [p for p in params if p != "*"]
            given = set(params[:positional]) | {name for name, _ in named}
            missing = [p for p, has_default in signature.items() if not has_default and p not in given]
            if positional > len(params):
                problems.append(f"EXEC {key}: {positional} positional arguments for {len(params)} parameters")
            elif wrong:
                problems.append(f"EXEC {key}: no parameter {', '.join(wrong)}")
            elif missing:
                problems.append(f"EXEC {key}: {', '.join(missing)} not passed and without default")
            else:
                self.coverage.resolved["parameter"] += len(named) + positional
                return
        self.problems.append(problems[0])

    def v_transaction_statement(self, seg, scope):
        """ROLLBACK TRANSACTION name rolls back to a savepoint: one this batch SAVEs."""
        code = _code(seg)
        name = next((_ident(c.raw) for c in code if c.is_type("naked_identifier", "quoted_identifier")), None)
        if name is None or code[0].raw.upper() != "ROLLBACK":
            return
        saved = {_ident(c.raw) for t in self.tree.recursive_crawl("transaction_statement") if _code(t)[0].raw.upper() == "SAVE"
                 for c in _code(t) if c.is_type("naked_identifier", "quoted_identifier")}
        if name in saved:
            self.coverage.resolved["savepoint"] += 1
        else:
            self.problems.append(f"ROLLBACK TRANSACTION {name}: no SAVE TRANSACTION {name} in the batch")

    # definitions ---------------------------------------------------------------------------

    def v_create_procedure_statement(self, seg, scope):
        for c in seg.segments:
            if c.is_type("object_reference"):
                self.coverage.resolved["definition"] += 1
            elif c.is_type("procedure_parameter_list"):
                self.visit_all([x for x in c.segments if x.is_type("expression", "data_type")], scope)
            else:
                self.visit(c, scope)

    def v_declare_segment(self, seg, scope):
        for c in seg.segments:
            if c.is_type("expression", "data_type"):
                self.visit(c, scope)
            elif c.is_type("bracketed"):  # a table variable's columns: their DEFAULT/CHECK expressions
                self.table_body(c, Source("table variable", set()), scope)

    def v_create_sequence_statement(self, seg, scope):
        self.coverage.resolved["definition"] += 1

    def v_create_table_statement(self, seg, scope):
        name = next(c for c in seg.segments if c.is_type("table_reference", "object_reference"))
        key = _key(_parts(name))
        own = Source(f"table {key}", self.cat.tables[key].columns if key in self.cat.tables else set())
        self.coverage.resolved["definition"] += 1
        for c in seg.segments:
            if c.is_type("bracketed"):
                self.table_body(c, own, scope)

    def v_alter_table_statement(self, seg, scope):
        """ALTER TABLE: the table resolves; ADD's column definitions see the table's columns,
        DROP COLUMN names one of them."""
        name = next(c for c in seg.segments if c.is_type("table_reference", "object_reference"))
        own = self.table(name, scope)
        local = Scope(scope)
        if own is not None:
            local.add([("",)], own)
        for c in seg.segments:
            if c.is_type("column_definition"):
                self.visit_all(_code(c)[1:], local)
            elif c.is_type("column_reference"):
                self.visit(c, local)
            elif c is not name:
                self.visit(c, local)

    def table_body(self, body, own: Source, scope) -> None:
        """Column definitions and table constraints: their expressions see the table's columns."""
        local = Scope(scope)
        if not own.columns:
            own = Source(own.what, {_ident(_code(d)[0].raw) for d in body.segments if d.is_type("column_definition")})
        local.add([("",)], own)
        for c in body.segments:
            if c.is_type("column_definition"):
                self.visit_all(_code(c)[1:], local)
            elif c.is_type("table_constraint"):
                self.constraint(c, own, local)

    def constraint(self, seg, own: Source, scope) -> None:
        """A table constraint: PRIMARY KEY/UNIQUE (columns) name the table's own columns, a
        CHECK (expression) is resolved in the table's scope, REFERENCES against its table."""
        for c in seg.segments:
            if c.is_type("bracketed") and not any(True for _ in c.recursive_crawl("expression")):
                self.check_columns(list(c.recursive_crawl("column_reference", "naked_identifier", "quoted_identifier",
                                                          recurse_into=False)), own)
            elif c.is_type("bracketed_index_column_list_grammar"):
                self.check_columns(list(c.recursive_crawl("index_column_definition")), own)
            elif c.is_type("references_constraint_grammar"):
                self.references(c, scope)
            elif c.get_type() == "object_reference":
                self.coverage.resolved["definition"] += 1  # CONSTRAINT name
            else:
                self.visit(c, scope)

    def v_column_constraint_segment(self, seg, scope):
        for c in seg.segments:
            if c.get_type() == "object_reference":
                self.coverage.resolved["definition"] += 1  # CONSTRAINT name
            elif c.is_type("references_constraint_grammar"):
                self.references(c, scope)
            else:
                self.visit(c, scope)

    def references(self, seg, scope) -> None:
        target = None
        for c in seg.segments:
            if c.is_type("table_reference", "object_reference"):
                target = self.table(c, scope)
            elif c.is_type("bracketed") and target is not None:
                self.check_columns(list(c.recursive_crawl("column_reference", "naked_identifier", "quoted_identifier",
                                                          recurse_into=False)), target)

    def v_create_index_statement(self, seg, scope):
        table = None
        for c in seg.segments:
            if c.is_type("index_reference"):
                self.coverage.resolved["definition"] += 1
            elif c.is_type("table_reference"):
                table = self.table(c, scope)
            elif c.is_type("bracketed_index_column_list_grammar", "bracketed") and table is not None:
                self.check_columns(list(c.recursive_crawl("index_column_definition")), table)
            elif c.is_type("where_clause") and table is not None:
                local = Scope(scope)
                local.add([("",)], table)
                self.visit(c, local)
            elif c.is_type("keyword") and c.raw.upper() == "INCLUDE":
                continue
            else:
                self.visit(c, scope)

    def v_alter_index_statement(self, seg, scope):
        for c in seg.segments:
            if c.is_type("table_reference"):
                self.table(c, scope)
            elif c.is_type("object_reference"):
                if c.raw.upper() != "ALL":
                    self.object(c, ("indexes",), "index")
            else:
                self.visit(c, scope)

    def v_update_statistics_statement(self, seg, scope):
        for c in seg.segments:
            if c.is_type("object_reference"):
                self.object(c, ("tables",), "table")
            elif c.is_type("quoted_identifier", "naked_identifier"):
                self.object((_ident(c.raw),), ("indexes",), "index")
            else:
                self.visit(c, scope)

    def _drop(self, seg, kinds, what):
        for c in seg.segments:
            if c.is_type("table_reference", "object_reference", "index_reference", "schema_reference"):
                self.object(c, kinds, what)

    def v_drop_table_statement(self, seg, scope):
        self._drop(seg, ("tables",), "table")

    def v_drop_procedure_statement(self, seg, scope):
        self._drop(seg, ("procedures",), "procedure")

    def v_drop_sequence_statement(self, seg, scope):
        self._drop(seg, ("sequences",), "sequence")

    def v_drop_schema_statement(self, seg, scope):
        self._drop(seg, ("schemas",), "schema")

    def v_drop_index_statement(self, seg, scope):
        self._drop(seg, ("indexes",), "index")

    def v_grant_statement(self, seg, scope):
        for securable in seg.recursive_crawl("securable_segment"):
            for c in securable.segments:
                if c.is_type("object_reference"):
                    self.object(c, ("tables", "procedures", "sequences", "functions", "schemas"), "object")


def _at(seg) -> int:
    return seg.pos_marker.source_slice.start


def check_refs(script: str, catalogue: Catalogue, where: str = "script") -> Coverage:
    """Resolve every name in every GO batch of a T-SQL script; raise RefError naming each
    unresolved one (and where: a section or script name). Returns what was resolved and
    what was skipped."""
    coverage = Coverage()
    problems = []
    for number, batch in enumerate(split_go_batches(script), 1):
        text, binds = _prepare(batch)
        checked = _check_batch(text, binds, catalogue)
        coverage.add(checked[0])
        problems.extend(f"{where}, batch {number}: {p}" for p in checked[1])
        coverage.skipped[len(coverage.skipped) - len(checked[0].skipped):] = [
            (f"{where}, batch {number}: {what}", why) for what, why in checked[0].skipped]
    if problems:
        raise RefError("\n".join(problems))
    return coverage


def _check_batch(text: str, binds: frozenset[str], catalogue: Catalogue) -> tuple[Coverage, list[str]]:
    batch = _Batch(catalogue, _tree(text), binds)
    batch.run()
    return batch.coverage, batch.problems


# -- the texts ----------------------------------------------------------------------------------


def section_text(file: str, name: str) -> str:
    """A rendered section as test_mssql_offline parses it: comment lines dropped, a JDBC
    `dbtable` fragment "(SELECT ...) AS alias" wrapped in the SELECT Spark wraps it in."""
    from test_mssql_offline import rendered

    text = "\n".join(line for line in rendered(file, name).splitlines() if not line.lstrip().startswith("--"))
    return f"SELECT * FROM {text.strip()}" if text.lstrip().startswith("(") else text


@functools.cache
def install_scripts() -> dict[str, str]:
    from queuectl.install import KINDS, install_script

    return {kind: install_script(None, "orders", kind, dialect="mssql") for kind in KINDS}


@functools.cache
def catalogue(kind: str | None = None) -> Catalogue:
    """What a kind's install script and its file's sections (today's and the history's) create;
    without a kind, what every install script and every section create. A kind's own objects
    differ from another's of the same name (pending's items table has due_at, fifo's has not;
    each kind's enqueue takes its own parameters), so a kind's file resolves against its own."""
    from test_mssql_offline import mssql_sections

    scripts = install_scripts()
    if kind is not None:
        return build_catalogue([scripts[kind], *(section_text(f, n) for f, n in mssql_sections() if f == kind)])
    return build_catalogue([*scripts.values(), *(section_text(f, n) for f, n in mssql_sections())])


def check_section(file: str, name: str) -> Coverage:
    """Resolve one rendered section: a queue kind's file against that kind's catalogue, the
    others (catalog, jobs, health, pipeline, grant, locks, storage, activation) against all."""
    return check_refs(section_text(file, name), catalogue(file if file in install_scripts() else None), f"{file}:{name}")


def check_install_script(kind: str) -> Coverage:
    return check_refs(install_scripts()[kind], catalogue(kind), f"install {kind}")
