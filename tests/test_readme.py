"""The README and the docs/ pages hold to what exists: the README stays short, every relative
link reaches a file (and a heading, when it names one), and every `queuectl <command>` they
show is a command of the installed CLI."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
# `queuectl` where a command line starts it: at the start, after a space, `(`, `&&` or `|`
# (and not Python's `from queuectl import`).
COMMAND = re.compile(r"(?:^|(?<=[\s(&|]))(?<!from )queuectl ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _code(text: str) -> list[str]:
    """The code a page shows: its fenced blocks without comments, and its inline code spans."""
    blocks = [re.sub(r"\s#.*$", "", line) for block in FENCE.findall(text) for line in block.splitlines()]
    return blocks + INLINE_CODE.findall(FENCE.sub("", text))


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@cache
def _commands(*group: str) -> set[str]:
    """The command names `queuectl [GROUP] --help` lists."""
    result = run_cli(*group, "--help")
    assert result.returncode == 0, result.stderr.decode()
    help_text = result.stdout.decode()
    panel = help_text[help_text.index("Commands"):]
    return set(re.findall(r"^[│|] ([a-z][a-z-]*)\s", panel, re.M))


def test_the_readme_is_at_most_250_lines():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, f"{_rel(page)}: {broken}"


def test_the_pages_have_links_to_check():
    assert len(LINK.findall(README.read_text())) >= 8


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_queuectl_command_shown_exists(page):
    shown = {match for code in _code(page.read_text()) for match in COMMAND.findall(code)}
    top = _commands()
    missing = sorted(f"queuectl {name}" for name, _ in shown if name not in top)
    for name, sub in shown:
        if name in top and sub and name in {"db", "jobs", "scheduler", "pipeline"} and sub not in _commands(name):
            missing.append(f"queuectl {name} {sub}")
    assert not missing, f"{_rel(page)} shows commands the CLI does not have: {missing}"


def test_the_command_check_sees_commands_and_refuses_a_made_up_one():
    shown = {m for code in _code(README.read_text()) for m in COMMAND.findall(code)}
    assert {"install", "worker", "health", "bench"} <= {name for name, _ in shown}
    assert "frobnicate" not in _commands()
