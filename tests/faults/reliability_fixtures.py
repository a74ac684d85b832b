"""The fault suite's `reliability` fixture: each scenario reports its ledger through it (one
line on the terminal, and into the figures file when $QUEUECTL_RELIABILITY_OUT names one;
see reliability.py). Imported by test_faults.py: a conftest.py here would be imported as
`conftest` and hide tests/conftest.py from the modules that import helpers from it."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from reliability import OUT_ENV, SCENARIOS


@pytest.fixture(scope="session")
def reliability_figures(admin_engine) -> Iterator[dict]:
    """Every ledger reported in this session, by scenario; written out at the end when asked."""
    scenarios: dict[str, dict] = {}
    yield scenarios
    out = os.environ.get(OUT_ENV)
    if not out or not scenarios:
        return
    with admin_engine.connect() as conn:
        version = conn.execute(sa.text("SHOW server_version")).scalar_one()
    figures = {
        "date": datetime.date.today().isoformat(),
        "server_version": version.split()[0],
        "cpus": os.cpu_count(),
        "scenarios": {key: scenarios[key] for key in SCENARIOS if key in scenarios},
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(figures, indent=2) + "\n")


@pytest.fixture
def reliability(request, reliability_figures, capsys) -> Callable[[dict], None]:
    """report(ledger): print the ledger's line and keep it as its scenario's figures."""

    def report(ledger: dict) -> None:
        key = ledger["scenario"]
        assert key in SCENARIOS, f"scenario {key!r} has no entry in reliability.SCENARIOS"
        assert SCENARIOS[key].test == request.node.originalname, (
            f"scenario {key!r} belongs to {SCENARIOS[key].test}, not {request.node.originalname}")
        with capsys.disabled():
            print("\nledger " + " ".join(f"{k}={v}" for k, v in ledger.items()))
        reliability_figures[key] = ledger

    return report
