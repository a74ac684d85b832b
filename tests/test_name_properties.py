"""Property tests for queue and schema names: any string is either accepted, and then
round-trips through a real install (found in the catalog under exactly that name, then
removed), or refused with the validator's one-line error, and then nothing changed.

Examples mix arbitrary text (quotes, unicode, control characters, reserved words) with
strings drawn from the accepted pattern, so both branches are exercised. The database
is slow: few examples, no deadline.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from queuectl.errors import UsageError
from queuectl.install import install_queue, remove_everything, uninstall_queue
from queuectl.registry import list_queues
from queuectl.names import (
    QUEUE_NAME_RE, RESERVED_QUEUE_NAMES, SQL_RESERVED_WORDS, QueueNames, quote_ident, validate_queue_name,
    validate_schema_name,
)

ACCEPTED = r"[a-z][a-z0-9_]{0,47}"
names = st.one_of(
    st.text(max_size=60),
    st.from_regex(ACCEPTED, fullmatch=True),
    st.sampled_from(sorted(SQL_RESERVED_WORDS)),
    st.text(alphabet='abc_"\';- \n\\.$1Aé', max_size=10),
)
DB_SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def database_objects(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema' "
            "UNION ALL SELECT nspname, '' FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' ORDER BY 1, 2"
        )).all()]


def expected_valid(name: str) -> bool:
    return bool(QUEUE_NAME_RE.fullmatch(name)) and name not in SQL_RESERVED_WORDS | RESERVED_QUEUE_NAMES


@pytest.mark.slow
@given(names)
@settings(max_examples=400, deadline=None)
@example('a"b')
@example("select")
@example("a" * 48)
@example("a" * 49)
def test_the_validator_accepts_exactly_the_documented_names_and_every_derived_identifier_quotes(name):
    if not expected_valid(name):
        with pytest.raises(UsageError) as caught:
            validate_queue_name(name)
        message = str(caught.value)
        assert "\n" not in message and "queue name" in message
        return
    assert validate_queue_name(name) == name
    # every object name a queue derives fits the identifier limit and quotes without escaping
    values = QueueNames(name).template_values()
    for value in values.values():
        assert re.fullmatch(r'[\'"a-z0-9_."]+', value), value
    assert quote_ident(QueueNames(name).table("meta_finished")) == f'"{name}_meta_finished"'


@pytest.mark.slow
@given(names)
@DB_SETTINGS
@example("orders_2")
@example('x"; DROP SCHEMA queuectl CASCADE; --')
def test_any_queue_name_round_trips_or_is_refused_with_nothing_changed(engine, name):
    schema = "props"
    before = database_objects(engine)
    try:
        validate_queue_name(name)
    except UsageError as refused:
        event("refused")
        assert not expected_valid(name) and "\n" not in str(refused)
        with pytest.raises(UsageError, match="queue name"):
            install_queue(engine, name, schema=schema)
        assert database_objects(engine) == before
        return
    event("installed")
    assert expected_valid(name)
    info = install_queue(engine, name, schema=schema)
    try:
        with engine.connect() as conn:
            assert [q.name for q in list_queues(conn, schema)] == [name] == [info.name]
            found = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": QueueNames(name, schema).qualified("meta")}).scalar()
            assert found is not None
    finally:
        uninstall_queue(engine, name, schema=schema)
        remove_everything(engine, schema)
    assert database_objects(engine) == before


@given(names)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example("public")
@example("user")
@example("pg_temp")
def test_any_schema_name_round_trips_or_is_refused_with_nothing_changed(engine, name):
    assume(name != "queuectl")  # the default schema is not a throwaway one
    before = database_objects(engine)
    try:
        validate_schema_name(name)
    except UsageError as refused:
        assert "\n" not in str(refused) and "schema name" in str(refused)
        with pytest.raises(UsageError, match="schema name"):
            install_queue(engine, "orders", schema=name)
        assert database_objects(engine) == before
        return
    assert name == "public" or name not in SQL_RESERVED_WORDS
    install_queue(engine, "orders", schema=name)
    try:
        with engine.connect() as conn:
            assert [q.name for q in list_queues(conn, name)] == ["orders"]
    finally:
        uninstall_queue(engine, "orders", schema=name)
        if name != "public":
            remove_everything(engine, name)
    if name != "public":
        assert database_objects(engine) == before
