"""The fault suite's reliability figures: its scenarios, and the table of docs/reliability.md made from a run.

Every fault test that ends in the ledger check reports its ledger through the `reliability`
fixture (reliability_fixtures.py), under one of the SCENARIOS below. With $QUEUECTL_RELIABILITY_OUT
naming a file, the test session writes every reported ledger there as JSON when it ends;
a run without it (a plain `make test`) writes nothing. `make reliability` runs tests/faults
with it set to a scratch file, renders the table of docs/reliability.md from that file:

    python tests/faults/reliability.py FIGURES.json docs/reliability.md

and keeps the file as docs/reliability.json. Rendering replaces what stands between the
page's `<!-- reliability:begin -->` and
`<!-- reliability:end -->` lines, and refuses a file that lacks a scenario or has one the
suite does not know (a partial run, e.g. with -k, renders nothing).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

OUT_ENV = "QUEUECTL_RELIABILITY_OUT"
BEGIN = "<!-- reliability:begin -->"
END = "<!-- reliability:end -->"


@dataclass(frozen=True)
class Scenario:
    test: str    # the test function that runs it and reports its ledger
    faults: str  # the faults injected, filled from the ledger's own figures


# The table's rows, in this order; test_reliability_table.py holds them to the tests that report.
SCENARIOS = {
    "sigkill-consumers": Scenario(
        "test_sigkill_consumers_mid_batch", "SIGKILL of {consumers_killed} consumers mid-batch"),
    "sigkill-consumers-horizon-pinned": Scenario(
        "test_sigkill_consumers_with_the_horizon_pinned",
        "SIGKILL of {consumers_killed} consumers mid-batch, a REPEATABLE READ snapshot held from before the first "
        "enqueue to the end (`VACUUM` left all {meta_dead_rows_vacuum_left:,} dead meta rows)"),
    "sigkill-cli-worker-threads": Scenario(
        "test_sigkill_cli_worker_mid_batch_threads",
        "SIGKILL of {workers_killed} `queuectl worker --concurrency 4` mid-batch; poison items"),
    "sigkill-cli-worker-processes": Scenario(
        "test_sigkill_cli_worker_mid_batch_processes",
        "SIGKILL of {workers_killed} `queuectl worker --processes --concurrency 2` mid-batch; poison items"),
    "handler-kills-its-process": Scenario(
        "test_handlers_killing_their_process_charge_only_their_own_item",
        "{handler_processes_killed} handler processes SIGKILLed by their own handler ({killer_items} items, on "
        "every attempt) under `queuectl worker --processes --concurrency 2`; poison items"),
    "fast-restart": Scenario("test_postgres_fast_restart", "PostgreSQL fast restart mid-load"),
    "immediate-restart": Scenario(
        "test_postgres_immediate_restart_under_cli_workers",
        "PostgreSQL immediate restart (crash recovery) under `queuectl worker` processes; poison items"),
    "terminate-backends": Scenario(
        "test_terminate_random_backends", "`pg_terminate_backend` of {backends_terminated} random client backends"),
    "oversized-payloads": Scenario(
        "test_oversized_payloads_are_refused_mid_load_and_nothing_else_is_affected",
        "{rejected_calls} enqueue calls with a payload over the limit"),
    "reorganize-under-load": Scenario(
        "test_reorganize_under_load",
        "{reorganize_runs} `queuectl reorganize` runs forced to rebuild ({indexes_rebuilt} REINDEX CONCURRENTLY)"),
    "reorganize-terminated-mid-reindex": Scenario(
        "test_reorganize_terminated_mid_reindex_under_load",
        "`pg_terminate_backend` of `queuectl reorganize` during `REINDEX INDEX CONCURRENTLY` of {index_cut} "
        "(beside {ballast_rows:,} finished rows): exit 3, {leftovers_dropped} leftover dropped in the same run; "
        "the next run rebuilt {indexes_rebuilt} indexes"),
    "sigkill-archiver": Scenario(
        "test_sigkill_archiver_mid_batch", "SIGKILL of {archivers_killed} `archive --continuous` mid-batch"),
    "sigkill-scheduler": Scenario(
        "test_sigkill_scheduler_mid_job", "SIGKILL of {schedulers_killed} `scheduler run` mid-job"),
}

COLUMNS = ("scenario", "faults injected", "items sent", "outcome unknown (stored)", "completed", "dead-lettered",
           "lost", "duplicated", "redelivered after lease expiry")


def row(key: str, ledger: dict) -> list[str]:
    """One table row: the scenario's faults and its ledger's figures."""
    return [
        f"`{key}`",
        SCENARIOS[key].faults.format(**ledger),
        f"{ledger['acknowledged_enqueues']:,}",
        f"{ledger['outcome_unknown_enqueues']:,} ({ledger['outcome_unknown_found']:,})",
        f"{ledger['done']:,}",
        f"{ledger['dead_with_error']:,}",
        f"{ledger['lost']:,}",
        f"{ledger['duplicated']:,}",
        f"{ledger['redelivered_after_lease_expiry']:,}",
    ]


def render(figures: dict) -> str:
    """The Markdown between the markers: the table and the line saying where it comes from."""
    scenarios = figures["scenarios"]
    missing = [key for key in SCENARIOS if key not in scenarios]
    unknown = [key for key in scenarios if key not in SCENARIOS]
    if missing or unknown:
        raise ValueError(f"the figures are not one whole run of the fault suite: missing {missing}, unknown {unknown}")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(key, scenarios[key])) + " |" for key in SCENARIOS]
    lines += ["", f"Figures from `make reliability` on {figures['date']} (PostgreSQL {figures['server_version']}, "
                  f"{figures['cpus']} cores): one run of each scenario; lost and duplicated are counted "
                  "before the test asserts they are zero."]
    return "\n".join(lines)


def replace_between_markers(text: str, body: str) -> str:
    begin, end = text.index(BEGIN), text.index(END)
    if end < begin:
        raise ValueError(f"{END} comes before {BEGIN}")
    return text[:begin + len(BEGIN)] + "\n" + body + "\n" + text[end:]


def table_scenarios(text: str) -> list[str]:
    """The scenario keys of the table between the markers, in their order."""
    table = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    return [line.split("|")[1].strip().strip("`") for line in table.splitlines()
            if line.startswith("| `")]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python tests/faults/reliability.py FIGURES.json docs/reliability.md", file=sys.stderr)
        return 2
    figures_path, page_path = map(Path, argv)
    try:
        body = render(json.loads(figures_path.read_text()))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {figures_path}: {exc}", file=sys.stderr)
        return 2
    page_path.write_text(replace_between_markers(page_path.read_text(), body))
    print(f"{page_path}: reliability table rendered from {figures_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
