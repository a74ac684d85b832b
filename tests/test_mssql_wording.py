"""Where the README or a `--help` text speaks of SQL Server, it says how far its T-SQL is
verified: "parse- and reference-checked, not run live" (docs/sqlserver.md says what that
covers). And `make test-mssql`, the one command that runs the live tests, refuses in one
line without a server's URL. No server is needed: this runs in `make test`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer

from queuectl import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PHRASE = "parse- and reference-checked, not run live"
SPEAKS_OF_SQL_SERVER = re.compile(r"\bSQL Server\b|\bmssql\b|\bT-SQL\b", re.I)  # not "PostgreSQL server"
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _flat(text: str) -> str:
    """Text with its line breaks and runs of spaces as single spaces (wrapping aside)."""
    return " ".join(text.split())


def readme_paragraphs(text: str) -> list[str]:
    """The README's prose paragraphs (code blocks and headings left out), one line each."""
    blocks = re.split(r"\n\s*\n", FENCE.sub("", text))
    return [_flat(b) for b in blocks if b.strip() and not b.lstrip().startswith("#")]


def mentions_without_the_phrase(texts: list[str]) -> list[str]:
    """Texts that speak of SQL Server (by name, as mssql outside code, or its T-SQL) but do
    not say how far it is verified."""
    return [t for t in texts if SPEAKS_OF_SQL_SERVER.search(re.sub(r"`[^`]*`", "", t)) and PHRASE not in t]


def help_texts() -> dict[str, str]:
    """Every help text of the CLI: each command's (and group's) and each of its options'
    and arguments', keyed by where it shows."""
    found: dict[str, str] = {}

    def walk(command: Any, path: str) -> None:  # click's Command, or the copy Typer vendors
        for label, text in ((path, command.help), (f"{path} (short)", command.short_help)):
            if text:
                found[label] = _flat(text)
        for param in command.params:
            text = getattr(param, "help", None)
            if text:
                found[f"{path} {param.opts[0]}"] = _flat(text)
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(cli.app), "queuectl")
    return found


def test_every_readme_paragraph_that_speaks_of_sql_server_says_it_is_not_run_live():
    paragraphs = readme_paragraphs(README.read_text())
    assert [p for p in paragraphs if "SQL Server" in p], "the README speaks of SQL Server somewhere"
    assert mentions_without_the_phrase(paragraphs) == []


def test_the_readmes_sql_server_section_has_the_one_command_and_the_docs_page():
    text = README.read_text()
    section = text[text.index("## SQL Server\n"):]
    section = section[:section.index("\n## ", 1)]
    assert PHRASE in _flat(section)
    assert re.search(r"QUEUECTL_TEST_MSSQL_URL='mssql\+pyodbc://[^']+' make test-mssql", section)
    assert "(docs/sqlserver.md)" in section


def test_every_help_text_that_speaks_of_sql_server_says_it_is_not_run_live():
    texts = help_texts()
    assert len(texts) > 100 and any("SQL Server" in t for t in texts.values())  # the walk sees the CLI
    missing = {where: text for where, text in texts.items() if mentions_without_the_phrase([text])}
    assert missing == {}


def test_the_rendered_help_carries_the_phrase(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setattr("sys.argv", ["queuectl", "reorganize", "--help"])
    with pytest.raises(SystemExit):
        cli.main()
    assert PHRASE in _flat(capsys.readouterr().out)


def test_the_check_finds_a_mention_without_the_phrase():
    assert mentions_without_the_phrase(["Runs on SQL Server too.", f"SQL Server ({PHRASE})", "PostgreSQL only.",
                                        "its own PostgreSQL server", "pip install `queuectl[mssql]`"]) == [
        "Runs on SQL Server too."]
    assert readme_paragraphs("# SQL Server\n\ntext\n\n```sh\nSQL Server\n```\n") == ["text"]


def test_make_test_mssql_without_a_url_refuses_in_one_line_with_exit_2():
    env = {k: v for k, v in os.environ.items() if k not in ("QUEUECTL_TEST_MSSQL_URL", "MAKEFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-s", "--no-print-directory", "test-mssql"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    ours = [line for line in result.stderr.splitlines() if line.startswith("make test-mssql:")]
    assert len(ours) == 1 and "QUEUECTL_TEST_MSSQL_URL is not set" in ours[0]
    assert "docker run -e ACCEPT_EULA=Y" in ours[0] and "mcr.microsoft.com/mssql/server:2022-latest" in ours[0]
    assert result.stdout == ""  # nothing was installed or run


def test_make_test_mssql_runs_the_live_and_the_offline_tsql_tests():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    env["QUEUECTL_TEST_MSSQL_URL"] = "mssql+pyodbc://sa:x@nowhere.invalid:1433/queuectl_test"
    dry = subprocess.run(["make", "-n", "--no-print-directory", "test-mssql"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    [pytest_line] = [line for line in dry.stdout.splitlines() if "-m pytest" in line]
    run = set(pytest_line.split())
    live = {str(p.relative_to(ROOT)) for p in ROOT.glob("tests/test_mssql_live*.py")}
    assert len(live) >= 3 and live <= run
    assert {"tests/test_mssql_offline.py", "tests/test_mssql_wording.py"} <= run
    assert "-n" not in run  # one process: the concurrency tests spawn their own
