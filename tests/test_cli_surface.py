"""What a user sees of the command line around the commands' work: tables and URLs on an
80-column terminal, --help, --version, shell completion, and the hint for a misspelt queue."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console
from rich.text import Text

from queuectl.cli.options import Fitted, make_table
from queuectl.install import install_queue

from conftest import run_cli

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def shown(result) -> str:
    """A command's stdout as the user reads it: colours and cursor codes taken out."""
    assert result.returncode in (0, 1), result.stderr.decode()
    return ANSI.sub("", result.stdout.decode())


def assert_readable(text: str, values, width: int = 80) -> None:
    """Every value is printed whole, each of its words intact (cut with an ellipsis or split
    across lines, a word would not appear), and no line is wider than the terminal."""
    assert "…" not in text and "..." not in text, text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width, text
    for value in values:
        for word in str(value).split():
            assert re.search(rf"(?<!\S){re.escape(word)}(?!\S)", text), f"{word!r} is not whole in:\n{text}"


def test_a_fitted_table_keeps_every_cell_whole_at_any_width():
    """As a table while the columns fit (free text wrapping between words), else one block of
    `column  value` lines per row; a name is never cut or split."""
    names = ["orders", "customer_notifications_eu_west"]
    sentence = "moved 12,000 rows in 12 batches (3,400 rows/s); done"
    table = make_table(("queue", "kind", "ready", "summary"), title="Queues", right=(2,), wrap={3: 12})
    for name in names:
        table.add_row(name, "watermark", "1,234,567", Text(sentence, style="yellow"))
    layouts = {}
    for width in (200, 80, 60, 40):
        console = Console(width=width, record=True, color_system=None)
        console.print(Fitted(table))
        text = console.export_text()
        assert_readable(text, [*names, "watermark", "1,234,567", sentence, "Queues"], width)
        layouts[width] = text
    assert all(name in line for name, line in zip(names, layouts[200].splitlines()[3:])), layouts[200]  # one row a line
    assert layouts[80].splitlines()[1].split() == ["queue", "kind", "ready", "summary"]  # a table, the sentence wrapped
    assert len(layouts[80].splitlines()) > len(layouts[200].splitlines())
    assert layouts[40].splitlines()[1].split() == ["queue", "orders"]  # one block per row
    assert "kind     watermark" in layouts[40]


@pytest.mark.slow
def test_tables_and_the_health_report_stay_readable_at_80_columns(db_url, engine, orders):
    """Each table command at 80 columns shows every name, kind, version, trigger and summary
    whole (compared with its own --json), and the health report does on an 80-column terminal."""
    install_queue(engine, "customer_notifications", "watermark")
    orders.enqueue_many(["a", "b"])
    assert run_cli("reorganize", "orders", "--dry-run", "--min-pages", "0", url=db_url).returncode == 0  # a run in the history
    # a job's one-line summary stays one line, however narrow the terminal or pipe (log scrapers read lines)
    archived = run_cli("archive", "orders", "--min-age", "0s", "--max-seconds", "5", url=db_url, columns=40)
    assert archived.returncode == 0 and len(archived.stdout.decode().splitlines()) == 1, archived.stdout

    queues = json.loads(run_cli("list", "--json", url=db_url).stdout)
    assert_readable(shown(run_cli("list", url=db_url, columns=80)),
                    [v for q in queues for v in (q["name"], q["kind"], q["schema_version"])])

    jobs = json.loads(run_cli("jobs", "list", "--json", url=db_url).stdout)
    assert_readable(shown(run_cli("jobs", "list", url=db_url, columns=80)),
                    [v for j in jobs for v in (j["job"], j["queue"], j["trigger"])])

    runs = json.loads(run_cli("jobs", "history", "--json", url=db_url).stdout)
    assert_readable(shown(run_cli("jobs", "history", url=db_url, columns=80)),
                    [v for r in runs for v in (r["job"], r["queue"], r["summary"], f"{r['runner_host']}:{r['runner_pid']}")])

    reorganized = json.loads(run_cli("reorganize", "orders", "--dry-run", "--min-pages", "0", "--json", url=db_url).stdout)
    assert_readable(shown(run_cli("reorganize", "orders", "--dry-run", "--min-pages", "0", url=db_url, columns=80)),
                    [v for i in reorganized["result"]["indexes"] for v in (i["table"], i["index"], i["decision"])])

    snapshot = json.loads(run_cli("inspect", "orders", "--json", url=db_url).stdout)["result"]["snapshot"]
    assert_readable(shown(run_cli("inspect", "orders", url=db_url, columns=80)),
                    [k for k in snapshot if k != "details"])

    report = json.loads(run_cli("health", "--json", url=db_url).stdout)
    on_terminal = shown(run_cli("health", url=db_url, columns=80, tty=True))
    assert_readable(on_terminal, [*(v for q in report["queues"] for v in (q["name"], q["kind"])),
                                  *(t["table"] for t in report["storage"]["tables"]),
                                  *(i["index"] for i in report["storage"]["indexes"])])
    assert "Queues" in on_terminal and "Indexes" in on_terminal


def _command_paths() -> list[list[str]]:
    """Every group and command of the app, as the words that name it (the app itself: [])."""
    from typer.main import get_command

    from queuectl.cli import app

    paths, todo = [], [([], get_command(app))]
    while todo:
        path, command = todo.pop()
        paths.append(path)
        todo += [([*path, name], sub) for name, sub in getattr(command, "commands", {}).items()]
    return paths


@pytest.mark.slow
def test_every_help_names_parameters_as_command_lines_do():
    """No Python annotation in --help (`<str>`, `<bool>`, `<float range>`) nor a required argument
    in braces in its usage line (`{name}`): NAME, [NAME]..., TEXT, INTEGER, choices, flags bare."""
    from typer.testing import CliRunner

    from queuectl.cli import app

    runner = CliRunner()
    paths = _command_paths()
    assert len(paths) > 30 and ["jobs", "history"] in paths and ["db", "url"] in paths
    helps = {}
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        helps[" ".join(path)] = result.output
        usage = next(line for line in result.output.splitlines() if "Usage:" in line)
        assert "{" not in usage and "<" not in usage, (path, usage)
        assert not re.findall(r"<(?:str|bool|int|float|list|Path|datetime|[a-z]+\|)[^>]*>", result.output), (path, result.output)
    assert "queuectl install [OPTIONS] NAME " in helps["install"]
    assert "queuectl uninstall [OPTIONS] [NAME] " in helps["uninstall"]
    assert "queuectl health [OPTIONS] [NAMES]... " in helps["health"]
    assert re.search(r"--max-attempts +INTEGER +Attempts", helps["install"])
    assert re.search(r"--strict +fifo only", helps["install"])  # a flag takes no value: no label
    assert re.search(r"--lock-wait +FLOAT \[x>=0\] +Seconds", helps["install"])
    assert "[text|json|openmetrics|prometheus]" in helps["health"]
    assert "preallocated slots [default: 65536]." in helps["install"]  # not taken for a markup tag


@pytest.mark.slow
def test_version_and_shell_completion():
    """--version answers from the package without loading the library; Typer's completion
    installs and completes commands."""
    import subprocess
    import sys
    from importlib.metadata import version

    shown_version = run_cli("--version")
    assert shown_version.returncode == 0 and shown_version.stdout.decode() == f"queuectl {version('queuectl')}\n"
    probe = ("import sys\nsys.argv = ['queuectl', '--version']\nfrom queuectl.cli import main\ntry:\n    main()\n"
             "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'psycopg')"
             " or m.startswith(('queuectl.client', 'queuectl.health', 'queuectl.jobs', 'queuectl.engine.postgresql'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60)
    assert loaded.stdout.decode().splitlines() == ["queuectl 0.1.0", "[]"], loaded.stderr.decode()

    helped = run_cli("--help").stdout.decode()
    assert "--install-completion" in helped and "--show-completion" in helped and "--version" in helped
    # Typer's own switch for tests: the shell is the one named, not the one running the tests (make's sh)
    script = run_cli("--show-completion", "bash", env_extra={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "complete -o default -F _queuectl_completion queuectl" in script.stdout.decode()
    completed = run_cli(env_extra={"_QUEUECTL_COMPLETE": "complete_bash", "COMP_WORDS": "queuectl jobs hi", "COMP_CWORD": "2"})
    assert completed.returncode == 0 and completed.stdout.split() == [b"history"]


def test_a_misspelt_queue_name_suggests_the_installed_one(db_url, engine, orders, capsys, monkeypatch):
    """Every command that reaches a queue names the nearest installed queue; with none near,
    it still says how to install the one asked for."""
    from jobs_helpers import invoke

    install_queue(engine, "ticks", "watermark")
    for args in (["enqueue", "ordrs", "x"], ["dequeue", "ordrs"], ["worker", "ordres", "--handler", "json:loads"],
                 ["archive", "ordrs"], ["jobs", "run", "inspect", "ordrs"], ["grant", "ordrs", "--producer", "p"],
                 ["upgrade", "ordrs"], ["uninstall", "ordrs", "--yes"], ["correct-watermark", "tick"]):
        code, out, err = invoke(capsys, monkeypatch, *args, url=db_url)
        asked = next(word for word in args if word in ("ordrs", "ordres", "tick"))
        meant = "ticks" if asked == "tick" else "orders"
        assert (code, out) == (2, ""), (args, out, err)
        assert err.strip() == f"error: queue {asked!r} is not installed in schema 'queuectl' (did you mean {meant!r}?)", args
    code, _, err = invoke(capsys, monkeypatch, "health", "ordrs", "zzz", url=db_url)
    assert code == 3 and err.strip() == "error: queue(s) not installed in schema 'queuectl': ordrs (did you mean 'orders'?), zzz"
    code, _, err = invoke(capsys, monkeypatch, "enqueue", "invoices", "x", url=db_url)
    assert code == 2 and err.strip() == "error: queue 'invoices' is not installed in schema 'queuectl': run `queuectl install invoices`"


def test_every_help_paragraph_is_one_line_that_help_wraps_to_the_terminal():
    """A line break inside a paragraph of a command's docstring survives into --help, so on an
    80-column terminal the paragraph comes out ragged (a short line, then the rest wrapped):
    each paragraph is one line, and --help wraps it to the terminal's width."""
    from typer.main import get_command

    from queuectl.cli import app

    ragged = []
    todo = [([], get_command(app))]
    while todo:
        path, command = todo.pop()
        todo += [([*path, name], sub) for name, sub in getattr(command, "commands", {}).items()]
        for paragraph in (command.help or "").strip().split("\n\n"):
            if "\n" in paragraph.strip() and not paragraph.lstrip().startswith("\b"):
                ragged.append((" ".join(path), paragraph.strip()[:60]))
    assert not ragged, ragged
