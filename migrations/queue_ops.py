"""Helpers the revisions share: render a kind's SQL section for the queue being migrated,
keep its row in the catalog registry in step with its schema version, and run a catalog
section for the catalog's own revisions."""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import context, op

from queuectl.catalog import QueueSettings, queues_table
from queuectl.engine import adapter_for
from queuectl.grants import FUNCTION_ARGUMENTS, function_values, secured_calls
from queuectl.kindspec import kind_template_values
from queuectl.names import QueueNames, quote_ident
from queuectl.sqlfiles import render


def _target() -> tuple[QueueNames, str, QueueSettings]:
    attrs = context.config.attributes
    return QueueNames(attrs["queue"], attrs["schema"]), attrs["kind"], attrs["settings"]


def run_section(file: str, section: str, extra: dict[str, str | int] | None = None) -> None:
    """Execute one named section of sql/<engine>/<file>.sql, batch by batch.

    The engine adapter names the SQL folder and splits the section (statements on
    PostgreSQL, GO batches on SQL Server, where Alembic's --sql output puts GO after each).
    `extra`: more values for the template (quoted identifiers, from QueueNames, or integers).
    """
    names, kind, settings = _target()
    adapter = adapter_for(op.get_context().dialect.name)
    values: dict[str, str | int] = {**names.template_values(), **kind_template_values(names, kind), **settings.as_dict(),
                                    **(extra or {})}
    for statement in adapter.split_batches(render(adapter.sql_dir, file, section, values)):
        op.execute(sa.text(statement))


def run_claim_sections(file: str, section: str) -> None:
    """Run a section once per rendering QueueNames.claim_variants() lists (reliable.sql
    create_claim_calls: on the parents, then on each slot's tables)."""
    names, _kind, _settings = _target()
    for variant in names.claim_variants():
        run_section(file, section, variant)


def run_lease_sections(file: str, section: str) -> None:
    """Run a section once per rendering QueueNames.lease_variants() lists (reliable.sql
    create_lease_calls: on each slot's tables)."""
    names, _kind, _settings = _target()
    for variant in names.lease_variants():
        run_section(file, section, variant)


def run_catalog_section(file: str, section: str) -> None:
    """Execute one named section of sql/<engine>/<file>.sql for the catalog being migrated
    (its only placeholder is {{schema}})."""
    adapter = adapter_for(op.get_context().dialect.name)
    values = {"schema": quote_ident(context.config.attributes["schema"])}
    for statement in adapter.split_batches(render(adapter.sql_dir, file, section, values)):
        op.execute(sa.text(statement))


def replace_functions(file: str, *sections: str) -> None:
    """Run sections that replace the queue's functions in place (CREATE OR REPLACE), then give
    back what that resets on the ones `queuectl grant` secured (grant.sql:
    resecure_functions), so granted roles keep working across the upgrade or downgrade."""
    for section in sections:
        run_section(file, section)
    names, kind, _settings = _target()
    adapter = adapter_for(op.get_context().dialect.name)
    values = function_values(names, kind, secured_calls(kind))
    for statement in adapter.split_batches(render(adapter.sql_dir, "grant", "resecure_functions", values)):
        op.execute(sa.text(statement))


def replace_signatures(file: str, sections: tuple[str, ...], changes: tuple[tuple[str, str, str], ...],
                       drop: str) -> None:
    """Replace functions by ones with other arguments: run `sections` (they create the new
    functions beside the old), give each new one the old one's grants (`changes`: the call,
    its argument types before and after; grant.sql: carry_function_grants), run `drop` (it
    drops the old ones), then what replace_functions runs after its sections. On SQL Server
    nothing is carried: its revisions alter procedures in place, which keeps their
    permissions."""
    for section in sections:
        run_section(file, section)
    names, kind, _settings = _target()
    if adapter_for(op.get_context().dialect.name).sql_dir == "postgresql":
        for call, old, new in changes:
            # the types are the kind's fixed lists (grants.FUNCTION_ARGUMENTS), never user input
            if old not in FUNCTION_ARGUMENTS[kind][call] or new not in FUNCTION_ARGUMENTS[kind][call]:
                raise ValueError(f"{kind} call {call}: unknown argument types {old!r} or {new!r}")
            run_section("grant", "carry_function_grants", {
                **function_values(names, kind, ()), "function_literal": f"'{names.table(call)}'",
                "old_types": f"'{old}'", "new_types": f"'{new}'"})
    replace_functions(file, drop)


def register(revision: str) -> None:
    """Insert the queue's registry row (first revision of a kind)."""
    names, kind, settings = _target()
    table = queues_table(names.schema)
    op.execute(
        table.insert().values(
            name=names.queue,
            kind=kind,
            schema_version=revision,
            # a cast of a text literal renders in offline (--sql) mode too
            settings=sa.cast(sa.literal(settings.to_json(), sa.Text()), table.c.settings.type),
        )
    )


def set_version(revision: str) -> None:
    """Record the queue's schema version after a later revision (or its downgrade)."""
    names, _kind, _settings = _target()
    table = queues_table(names.schema)
    op.execute(
        table.update()
        .where(table.c.name == names.queue)
        .values(schema_version=revision, updated_at=sa.func.now())
    )


def unregister() -> None:
    names, _kind, _settings = _target()
    table = queues_table(names.schema)
    op.execute(table.delete().where(table.c.name == names.queue))


def record_settings(without: tuple[str, ...] = ()) -> None:
    """Write the queue's settings to its registry row (a revision that adds a setting),
    leaving out `without` (the downgrade of that revision)."""
    names, _kind, settings = _target()
    table = queues_table(names.schema)
    values = {k: v for k, v in settings.as_dict().items() if k not in without}
    op.execute(
        table.update()
        .where(table.c.name == names.queue)
        .values(settings=sa.cast(sa.literal(json.dumps(values, sort_keys=True), sa.Text()), table.c.settings.type))
    )
