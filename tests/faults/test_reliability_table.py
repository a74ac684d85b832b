"""The reliability table of docs/reliability.md: one row per fault scenario the suite runs, rendered from
the figures file a real run wrote (`make reliability`), never typed by hand."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from reliability import SCENARIOS, render, replace_between_markers, table_scenarios

FAULTS_DIR = Path(__file__).resolve().parent
ROOT = FAULTS_DIR.parents[1]
PAGE = ROOT / "docs" / "reliability.md"
FIGURES = ROOT / "docs" / "reliability.json"


def _ledger_tests() -> set[str]:
    """Every test function of tests/faults that takes the `reliability` fixture."""
    found = set()
    for path in FAULTS_DIR.glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and "reliability" in [a.arg for a in node.args.args]:
                found.add(node.name)
    return found


def test_every_ledger_test_is_one_scenario_and_every_scenario_has_its_test():
    tests = [s.test for s in SCENARIOS.values()]
    assert len(set(tests)) == len(tests), "two scenarios name the same test"
    assert set(tests) == _ledger_tests()


def test_the_table_has_one_row_per_scenario_in_order():
    assert table_scenarios(PAGE.read_text()) == list(SCENARIOS)


def test_the_table_is_the_rendering_of_the_committed_figures():
    text = PAGE.read_text()
    assert replace_between_markers(text, render(json.loads(FIGURES.read_text()))) == text


def test_figures_of_a_partial_run_render_nothing():
    figures = json.loads(FIGURES.read_text())
    del figures["scenarios"][next(iter(SCENARIOS))]
    with pytest.raises(ValueError, match="not one whole run"):
        render(figures)
