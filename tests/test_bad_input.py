"""Bad input: every class of it gets one clear line on stderr, its exit code, no
traceback, and leaves the database exactly as it was.

Each test installs queue `orders` with one item, snapshots the database (schemas,
relations, functions, extensions, roles, the queue registry, job runs, items), drives the
real CLI with a table of bad inputs (a few subprocesses at a time), checks each message
word for word, and compares the snapshot afterwards.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import run_cli
from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.names import SQL_RESERVED_WORDS, validate_queue_name, validate_schema_name

USAGE = 2       # every command: a user error
UNKNOWN = 3     # queuectl health: no verdict (2 would read as CRITICAL to a monitor)
NAME_RULE = "use 1-48 characters, lowercase letters, digits and underscores, starting with a letter"


def bad_queue(name: str) -> str:
    return f"error: invalid queue name {name!r}: {NAME_RULE} (e.g. 'orders')"


def bad_schema(name: str) -> str:
    return f"error: invalid schema name {name!r}: {NAME_RULE} and not with 'pg_'"


def snapshot(engine: sa.Engine) -> dict[str, object]:
    """Everything a bad input could have changed, as plain values."""
    user_ns = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
    with engine.connect() as conn:
        def rows(sql: str) -> list[tuple]:
            return [tuple(r) for r in conn.execute(sa.text(sql)).all()]

        snap: dict[str, object] = {
            "schemas": rows(f"SELECT nspname FROM pg_namespace n WHERE {user_ns} ORDER BY 1"),
            "relations": rows("SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
                              f"ON n.oid = c.relnamespace WHERE {user_ns} ORDER BY 1, 2"),
            "functions": rows("SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), "
                              "p.prosecdef, p.proacl::text FROM pg_proc p JOIN pg_namespace n "
                              f"ON n.oid = p.pronamespace WHERE {user_ns} ORDER BY 1, 2, 3"),
            "extensions": rows("SELECT extname FROM pg_extension ORDER BY 1"),
            "roles": rows("SELECT rolname FROM pg_roles WHERE rolname NOT LIKE 'pg\\_%' ORDER BY 1"),
        }
        for label, table, columns in (("registry", "queuectl.queues", "name, kind, schema_version, settings::text"),
                                      ("job_runs", "queuectl.job_runs", "count(*)"),
                                      ("items", "queuectl.orders_meta", "id, status, attempts, due_at")):
            exists = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar()
            snap[label] = rows(f"SELECT {columns} FROM {table} ORDER BY 1") if exists else None
    return snap


@pytest.fixture
def installed(engine) -> sa.Engine:
    install_queue(engine, "orders")
    with Queue(engine, "orders") as queue:
        queue.enqueue("one item")
    return engine


def check_cases(engine: sa.Engine, db_url: str, cases: list[tuple[list[str], int, str]]) -> None:
    """Run each (args, exit code, message) and check it; then that nothing changed."""
    before = snapshot(engine)

    def run(case):
        return run_cli(*case[0], url=db_url)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, cases))
    problems = []
    for (args, code, message), result in zip(cases, results):
        stderr = result.stderr.decode("utf-8", "replace")
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        if result.returncode != code or lines != [message] or result.stdout:
            problems.append(f"{args!r}: exit {result.returncode} (want {code}), stderr {lines!r}, "
                            f"stdout {result.stdout[:200]!r}; want {message!r}")
    assert not problems, "\n".join(problems)
    assert snapshot(engine) == before


# -- names -----------------------------------------------------------------------------------

BAD_QUEUE_NAMES = ['a"b', "a;drop", "a b", "ñame", "名前", "🎉", "1abc", "", "a" * 49, "Orders", "a-b",
                   "orders\n", "a:smile:b", "a[red]b"]
RESERVED = ["select", "user", "order", "table", "public", "index"]


@pytest.mark.slow
def test_bad_queue_names_are_refused_by_every_command_and_change_nothing(installed, db_url):
    cases = [(["install", name], USAGE, bad_queue(name)) for name in BAD_QUEUE_NAMES]
    cases += [(["install", word], USAGE,
               f"error: queue name {word!r} is an SQL reserved word: choose another (e.g. '{word}_queue')")
              for word in RESERVED]
    cases.append((["install", "alembic"], USAGE, "error: queue name 'alembic' is reserved for queuectl's catalog: choose another"))
    # the commands that reach an existing queue refuse the same names before touching it
    name = 'orders";drop table x;--'
    for command in (["enqueue", name, "x"], ["dequeue", name], ["uninstall", name, "--yes"], ["upgrade", name],
                    ["archive", name], ["reorganize", name], ["inspect", name], ["reset-stale", name],
                    ["grant", name, "--producer", "p"], ["worker", name, "--handler", "json:dumps"],
                    ["correct-watermark", name], ["repair-ring", name], ["jobs", "run", "archive", name]):
        cases.append((command, USAGE, bad_queue(name)))
    cases.append((["health", name], UNKNOWN, bad_queue(name)))
    check_cases(installed, db_url, cases)


@pytest.mark.slow
def test_overlong_names_for_a_kind_are_refused_before_anything_is_made(installed, db_url):
    name = "w" * 46  # fits the general rule, not a watermark queue's 18-character suffixes
    check_cases(installed, db_url, [(["install", name, "--kind", "watermark"], USAGE,
                                     f"error: queue name {name!r} is too long for kind watermark: at most 45 "
                                     "characters (its SQL objects add suffixes up to 18 characters)")])


BAD_SCHEMAS = ['a"b', "a;drop", "Bad", "pg_catalog", "pg_x", "", "a" * 49, "ñ", "sch ema", "1abc"]


@pytest.mark.slow
def test_bad_schema_names_are_refused_and_change_nothing(installed, db_url):
    cases = [(["install", "orders2", "--schema", s], USAGE, bad_schema(s)) for s in BAD_SCHEMAS]
    cases += [(["install", "orders2", "--schema", w], USAGE,
               f"error: schema name {w!r} is an SQL reserved word: choose another (e.g. '{w}_queues')")
              for w in ("select", "user", "order", "group")]
    for command in (["list"], ["upgrade"], ["enqueue", "orders", "x"], ["dequeue", "orders"], ["archive", "orders"],
                    ["jobs", "history"], ["uninstall", "--all", "--yes"], ["grant", "orders", "--producer", "p"]):
        cases.append(([*command, "--schema", "a;drop"], USAGE, bad_schema("a;drop")))
    cases.append((["health", "--schema", "a;drop"], UNKNOWN, bad_schema("a;drop")))
    check_cases(installed, db_url, cases)


def test_names_longer_than_shown_are_cut_in_the_message():
    with pytest.raises(UsageError) as caught:
        validate_schema_name("x" * 5000)
    assert len(str(caught.value)) < 250 and "x" * 40 + "..." in str(caught.value)


def test_the_reserved_words_cover_every_reserved_keyword_of_the_server(engine):
    with engine.connect() as conn:
        keywords = set(conn.execute(sa.text("SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T')")).scalars())
    assert keywords - SQL_RESERVED_WORDS == set()
    for word in sorted(keywords):
        with pytest.raises(UsageError, match="reserved word"):
            validate_queue_name(word)


# -- config files ----------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.slow
def test_malformed_scheduler_configs_are_refused_and_change_nothing(installed, db_url, tmp_path):
    p = lambda name, text: write(tmp_path, name, text)  # noqa: E731
    cases = [
        (p("syntax.toml", "[jobs.archive\ninterval ="), "config file {} is not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 14)"),
        (p("binary.toml", b"\xff\xfe[jobs]"), "config file {} is not UTF-8 text (TOML files are)"),
        (str(tmp_path / "missing.toml"), "config file {} does not exist"),
        (str(tmp_path), "cannot read config file {}: Is a directory"),
        (p("section.toml", "[schedule]\nworkers = 2\n"), "{}: unknown section(s) schedule; expected [scheduler] and [jobs.<name>]"),
        (p("key.toml", "[scheduler]\nworker = 2\n"), "{}: unknown [scheduler] key(s) worker"),
        (p("jobkey.toml", '[jobs.archive]\nintervall = "1m"\n'), "[jobs.archive]: unknown option(s) intervall; known: batch, dead_min_age, delay, history_retention, idle_delay, lock_timeout, max_seconds, min_age, purge_every, rotate_for, rotate_items, statement_timeout"),
        (p("job.toml", '[jobs.nosuch]\ninterval = "1m"\n'), "unknown job 'nosuch': choose one of archive, reset_stale, inspect, reorganize, upkeep, correct_watermark, compact, repair_ring"),
        (p("jobs.toml", "jobs = 5\n"), "{}: jobs must be a table ([jobs] with [jobs.<name>] tables)"),
        (p("scheduler.toml", "scheduler = 5\n"), "{}: scheduler must be a table ([scheduler])"),
        (p("workers.toml", '[scheduler]\nworkers = "8"\n'), "[scheduler] workers must be a whole number from 1 to 64"),
        (p("enabled.toml", '[jobs.archive]\nenabled = "yes"\n'), "[jobs.archive] enabled must be true or false"),
        (p("queues.toml", '[jobs.archive]\nqueues = "orders"\n'), "[jobs.archive] queues must be a list of queue names"),
        (p("queuename.toml", '[jobs.archive]\nqueues = ["a;drop"]\n'), bad_queue("a;drop")[len("error: "):]),
        (p("schema.toml", '[scheduler]\nschema = "select"\n'), "schema name 'select' is an SQL reserved word: choose another (e.g. 'select_queues')"),
        (p("batch.toml", "[jobs.archive]\nbatch = -1\n"), "[jobs.archive] batch must be a whole number from 1 to 10000, got -1"),
        (p("hugebatch.toml", "[jobs.archive]\nbatch = 1000000000\n"), "[jobs.archive] batch must be a whole number from 1 to 10000, got 1000000000"),
        (p("batchtype.toml", '[jobs.archive]\nbatch = "many"\n'), "[jobs.archive] batch must be a whole number from 1 to 10000, got 'many'"),
        (p("minage.toml", '[jobs.archive]\nmin_age = "-5s"\n'), "[jobs.archive] min_age must be a duration like 30s, 5m, 2h or 30d, got '-5s'"),
        (p("refresh.toml", '[scheduler]\nrefresh = "soon"\n'), "[scheduler] refresh must be a duration like 30s, 5m, 2h or 30d, got 'soon'"),
    ]
    check_cases(installed, db_url, [(["jobs", "list", "--config", path], USAGE, "error: " + message.replace("{}", path))
                                    for path, message in cases])


BAD_CRONS = [
    ("61 * * * *", "Error validating expression '61': the last value (61) is higher than the maximum value (59)"),
    ("not a cron", "Wrong number of fields; got 3, expected 5"),
    ("* * * *", "Wrong number of fields; got 4, expected 5"),
    ("* * 31 2 * *", "Wrong number of fields; got 6, expected 5"),
    ("*/x * * * *", "Unrecognized expression \"*/x\" for field \"minute\""),
]
BAD_INTERVALS = [
    ('"-5s"', "interval must be a duration like 30s, 5m, 2h or 30d, got '-5s'"),
    ("0", "interval must be at least 100ms"),
    ('"50ms"', "interval must be at least 100ms"),
    ('"5 fortnights"', "interval must be a duration like 30s, 5m, 2h or 30d, got '5 fortnights'"),
    ("1e12", "interval must be between 0 and 10 years, got 1000000000000.0"),
    ("nan", "interval must be between 0 and 10 years, got nan"),
    ("inf", "interval must be between 0 and 10 years, got inf"),
    ("true", "interval must be a duration like 30s, 5m, 2h or 30d, got True"),
]


@pytest.mark.slow
def test_invalid_cron_expressions_and_intervals_are_refused_and_change_nothing(installed, db_url, tmp_path):
    cases = []
    for i, (cron, reason) in enumerate(BAD_CRONS):
        path = write(tmp_path, f"cron{i}.toml", f'[jobs.reorganize]\ncron = "{cron}"\n'.replace('"*/x', '"*/x'))
        cases.append((path, f"[jobs.reorganize] cron {cron!r}: {reason}"))
    cases.append((write(tmp_path, "cronint.toml", "[jobs.reorganize]\ncron = 5\n"),
                  '[jobs.reorganize] cron must be a crontab string like "*/5 * * * *", got 5'))
    cases.append((write(tmp_path, "both.toml", '[jobs.archive]\ncron = "* * * * *"\ninterval = "1m"\n'),
                  "[jobs.archive]: give interval or cron, not both"))
    for i, (value, reason) in enumerate(BAD_INTERVALS):
        cases.append((write(tmp_path, f"interval{i}.toml", f"[jobs.archive]\ninterval = {value}\n"), f"[jobs.archive] {reason}"))
    argv = lambda path: ["jobs", "list", "--config", path]  # noqa: E731
    check_cases(installed, db_url, [(argv(path), USAGE, "error: " + message) for path, message in cases])
    # the scheduler reads the same config before it connects or schedules anything
    path, message = cases[0]
    check_cases(installed, db_url, [(["scheduler", "run", "--max-seconds", "1", "--config", path], USAGE, "error: " + message)])


@pytest.mark.slow
def test_malformed_health_configs_are_refused_with_unknown_and_change_nothing(installed, db_url, tmp_path):
    p = lambda name, text: write(tmp_path, name, text)  # noqa: E731
    cases = [
        (p("syntax.toml", "[health\n"), "config {} is not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 8)"),
        (p("binary.toml", b"\xff\xfe"), "config {} is not UTF-8 text (TOML files are)"),
        (str(tmp_path / "missing.toml"), "cannot read config {}: No such file or directory"),
        (str(tmp_path), "cannot read config {}: Is a directory"),
        (p("section.toml", "health = 5\n"), "config {}: [health] must be a table"),
        (p("option.toml", "[health]\nrate_windw = \"5m\"\n"), "config {}: unknown health option 'rate_windw'"),
        (p("thresholds.toml", "[health]\nthresholds = 5\n"), "config {}: health.thresholds must be a table like [health.thresholds]"),
        (p("threshold.toml", "[health.thresholds]\nnosuch = { warn = 1 }\n"), "config {}: health.thresholds.nosuch.warn: unknown health threshold 'nosuch': choose one of backlog, dead_letters, dead_tuples, idle_in_transaction, index_bloat, job_failures, oldest_ready_age, pending_overdue, prepared_xact_age, ring_fill, rotation_lag, slot_xmin_age, stuck_items, table_bloat, watermark_lag, xact_age"),
        (p("level.toml", "[health.thresholds]\ndead_letters = { warns = 1 }\n"), "config {}: health.thresholds.dead_letters.warns: threshold level must be warn or crit, got 'warns' (e.g. dead_letters.warn=...)"),
        (p("leveltype.toml", "[health.thresholds]\ndead_letters = 5\n"), "config {}: health.thresholds.dead_letters must be a table like { warn = ..., crit = ... }"),
        (p("value.toml", '[health.thresholds]\ndead_letters = { warn = "abc" }\n'), "config {}: health.thresholds.dead_letters.warn: 'abc' is not a count: use e.g. 100, 10k, 1.5M"),
        (p("negative.toml", "[health.thresholds]\ndead_letters = { warn = -5 }\n"), "config {}: health.thresholds.dead_letters.warn: -5 is not a count from 0 to 1,000,000,000,000,000"),
        (p("nan.toml", "[health.thresholds]\noldest_ready_age = { crit = nan }\n"), "config {}: health.thresholds.oldest_ready_age.crit: nan is not a duration from 0 to 316,224,000s"),
        (p("order.toml", "[health.thresholds]\ndead_letters = { warn = 10, crit = 5 }\n"), "config {}: threshold dead_letters: warn (10) is above crit (5)"),
        (p("window.toml", '[health]\nrate_window = "-5m"\n'), "config {}: health.rate_window: '-5m' is not a duration: use e.g. 90s, 5m, 2h, 1d"),
        (p("absurd.toml", "[health]\nrate_window = 1e300\n"), "config {}: health.rate_window: 1e+300 is not a duration from 0 to 316,224,000s"),
        (p("zero.toml", "[health]\nhistory_scan = 0\n"), "config {}: health.history_scan must be positive"),
        (p("bool.toml", '[health]\ncreate_extension = "no"\n'), "config {}: health.create_extension must be true or false"),
    ]
    check_cases(installed, db_url, [(["health", "--config", path], UNKNOWN, "error: " + message.replace("{}", path))
                                    for path, message in cases])


# -- URLs --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_invalid_urls_and_unknown_dialects_are_one_line_errors(installed, db_url):
    expected_form = "expected e.g. postgresql://user@host:5432/dbname"
    cases = [
        ("garbage", f"error: invalid database URL: {expected_form}"),
        ("://nothing", f"error: invalid database URL: {expected_form}"),
        ("postgresql://u:pw@h:notaport/db", f"error: invalid database URL: the port is not a number ({expected_form})"),
        ("", f"error: the database URL is empty: give one (e.g. postgresql://user@host:5432/dbname) or leave --url out"),
        ("oracle://u:pw@h/db", "error: unsupported database dialect 'oracle' in oracle://u:***@h/db: queuectl supports postgresql and mssql"),
        ("mysql://u:pw@h/db", "error: unsupported database dialect 'mysql' in mysql://u:***@h/db: queuectl supports postgresql and mssql"),
        ("sqlite:///x.db", "error: unsupported database dialect 'sqlite' in sqlite:///x.db: queuectl supports postgresql and mssql"),
        ("postgresql://u:pw@no-such-host.invalid/db", "error: cannot connect to postgresql+psycopg://u:***@no-such-host.invalid/db: "
         "failed to resolve host 'no-such-host.invalid': [Errno -2] Name or service not known"),
    ]
    commands = (["install", "orders2"], ["list"], ["enqueue", "orders", "x"], ["install", "orders2", "--sql"])
    runs = [([*command, "--url", url], USAGE, message) for url, message in cases for command in commands
            if not (command[-1] == "--sql" and url.startswith("postgresql://u:pw@no-such"))]
    runs += [(["health", "--url", url], UNKNOWN, message) for url, message in cases]
    check_cases(installed, db_url, runs)


@pytest.mark.slow
def test_a_url_without_a_host_says_where_it_tried(installed, db_url):
    """No host means libpq's default socket: the error says so (not a Python traceback)."""
    result = run_cli("list", "--url", "postgresql://u:pw@/db")
    lines = result.stderr.decode().splitlines()
    assert result.returncode == USAGE and len(lines) == 1
    assert lines[0].startswith("error: cannot connect to postgresql+psycopg://u:***@/db: ") and "socket" in lines[0]


# -- sizes, durations, leases ------------------------------------------------------------------


@pytest.mark.slow
def test_negative_zero_and_absurd_numbers_are_refused_and_change_nothing(installed, db_url):
    batch = "must be a whole number from 1 to 10000, got"
    cases = [
        (["dequeue", "orders", "--batch", "-1"], f"error: batch size {batch} -1"),
        (["dequeue", "orders", "--batch", "0"], f"error: batch size {batch} 0"),
        (["dequeue", "orders", "--batch", str(10**9)], f"error: batch size {batch} 1000000000"),
        (["dequeue", "orders", "--lease", "-5"], "error: lease must be a number of seconds from 0.001 to 31622400, got -5.0"),
        (["dequeue", "orders", "--lease", "nan"], "error: lease must be a number of seconds from 0.001 to 31622400, got nan"),
        (["enqueue", "orders", "x", "--delay", "1e12"], "error: delay must be a number of seconds from 0 to 31622400, got 1000000000000.0"),
        (["enqueue", "orders", "x", "--delay", "-5"], "error: delay must be a number of seconds from 0 to 31622400, got -5.0"),
        (["enqueue", "orders", "x", "--delay", "inf"], "error: delay must be a number of seconds from 0 to 31622400, got inf"),
        (["enqueue", "orders", "x", "--priority", "99999"], "error: priority must be a whole number from -32768 to 32767, got 99999"),
        (["archive", "orders", "--batch", "-1"], f"error: batch {batch} -1"),
        (["archive", "orders", "--batch", "0"], f"error: batch {batch} 0"),
        (["archive", "orders", "--batch", str(10**9)], f"error: batch {batch} 1000000000"),
        (["archive", "orders", "--min-age", "-5s"], "error: archive min_age must be a duration like 30s, 5m, 2h or 30d, got '-5s'"),
        (["archive", "orders", "--min-age", "5x"], "error: archive min_age must be a duration like 30s, 5m, 2h or 30d, got '5x'"),
        (["archive", "orders", "--delay", "1e12"], "error: archive delay must be a duration like 30s, 5m, 2h or 30d, got '1e12'"),
        (["archive", "orders", "--delay", "99999999999s"], "error: archive delay must be between 0 and 10 years, got '99999999999s'"),
        (["archive", "orders", "--max-seconds", "-1"], "error: archive max_seconds must be a duration like 30s, 5m, 2h or 30d, got '-1'"),
        (["archive", "orders", "--lock-timeout", "0"], "error: lock-timeout must be a number from 0.001 to 3600, got 0.0"),
        (["reset-stale", "orders", "--batch", "0"], f"error: batch {batch} 0"),
        (["reorganize", "orders", "--bloat", "500"], "error: rebuild-bloat-pct must be a number from 0 to 100, got 500.0"),
        (["reorganize", "orders", "--fragmentation", "nan"], "error: rebuild-fragmentation-pct must be a number from 0 to 100, got nan"),
        (["jobs", "run", "archive", "orders", "-o", "batch=-1"], f"error: batch {batch} -1"),
        (["jobs", "run", "archive", "orders", "-o", "min_age=-1"], "error: archive min_age must be between 0 and 10 years, got -1"),
        (["jobs", "history", "--last", "0"], "error: --last must be from 1 to 100000"),
        (["worker", "orders", "--handler", "json:dumps", "--batch", "0"], f"error: batch size {batch} 0"),
        (["worker", "orders", "--handler", "json:dumps", "--concurrency", "0"], "error: concurrency must be a whole number from 1 to 256, got 0"),
        (["worker", "orders", "--handler", "json:dumps", "--poll-interval", "-1"], "error: poll interval must be a number of seconds from 0.001 to 31622400, got -1.0"),
        (["install", "orders2", "--max-attempts", "0"], "error: max-attempts must be a whole number from 1 to 1000, got 0"),
        (["install", "orders2", "--lease", "0"], "error: lease-seconds must be a whole number from 1 to 604800, got 0"),
        (["install", "orders2", "--max-payload-bytes", "0"], "error: max-payload-bytes must be a whole number from 1 to 1073741824, got 0"),
        (["worker", "orders", "--handler", "json:dumps", "--reconnect-for", "-1"], "error: --reconnect-for must be from 0 to 86400 seconds, got -1"),
        (["install", "ring2", "--kind", "ring", "--size", str(10**12)], "error: size must be a whole number from 2 to 16,777,216, got 1000000000000"),
        (["bench", "--batch", "0"], "error: --batch must be 1-10000"),
        (["demo", "--rate", "-1"], "error: demo limits: 0.5-3600 seconds, 1-64 producers and consumers, batch 1-10000, rate 0 (unlimited) to 1000000"),
        (["demo", "--seconds", "-1"], "error: demo limits: 0.5-3600 seconds, 1-64 producers and consumers, batch 1-10000, rate 0 (unlimited) to 1000000"),
    ]
    runs = [(args, USAGE, message) for args, message in cases]
    runs += [(["health", "--watch", "0"], UNKNOWN, "error: --watch must be from 0.5 to 86400 seconds"),
             (["health", "--watch", "1", "--reconnect-for", "-1"], UNKNOWN, "error: --reconnect-for must be from 0 to 86400 seconds, got -1"),
             (["health", "--set", "dead_letters.warn=-1"], UNKNOWN, "error: '-1' is not a count: use e.g. 100, 10k, 1.5M"),
             (["health", "--set", "dead_letters.warn=99999999999999999999"], UNKNOWN,
              "error: '99999999999999999999' is not a count from 0 to 1,000,000,000,000,000")]
    check_cases(installed, db_url, runs)


@pytest.mark.parametrize("args, says", [
    (["dequeue", "orders", "--bacth", "5"], "No such option: --bacth"),
    (["dequeue", "orders", "--batch", "many"], "Invalid value for '--batch'"),
    (["archive", "orders", "--batch", "1.5"], "Invalid value for '--batch'"),
    (["jobs", "nosuch"], "No such command 'nosuch'"),
])
@pytest.mark.slow
def test_a_typo_or_wrong_type_is_the_parsers_usage_error_not_a_traceback(installed, db_url, args, says):
    """The parser's own message (with the usage), exit code 2, no traceback."""
    before = snapshot(installed)
    result = run_cli(*args, url=db_url)
    stderr = result.stderr.decode()
    assert result.returncode == USAGE and says in stderr, stderr
    assert "Traceback" not in stderr and "parser.py" not in stderr and result.stdout == b""
    assert snapshot(installed) == before


def test_one_queuectl_toml_serves_the_scheduler_and_health(tmp_path):
    """`queuectl health --config` reads [health]; the scheduler must not refuse that section."""
    from queuectl.health import load_config as health_config
    from queuectl.jobs.scheduler import load_config as scheduler_config

    path = write(tmp_path, "queuectl.toml", '[scheduler]\nworkers = 2\n[jobs.archive]\ninterval = "2m"\n'
                                            '[health]\nrate_window = "1m"\n')
    assert scheduler_config(path).jobs["archive"].interval == 120
    assert health_config(path).rate_window_s == 60
