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

    report = json.loads(run_cli("health", "--json", url=db_url).stdout)
    on_terminal = shown(run_cli("health", url=db_url, columns=80, tty=True))
    assert_readable(on_terminal, [*(v for q in report["queues"] for v in (q["name"], q["kind"])),
                                  *(t["table"] for t in report["storage"]["tables"]),
                                  *(i["index"] for i in report["storage"]["indexes"])])
    assert "Queues" in on_terminal and "Indexes" in on_terminal
