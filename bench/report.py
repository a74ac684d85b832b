"""Rich tables for a bench result document: every figure beside the ceiling that bounds it."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _med(stat: dict[str, Any] | None) -> float | None:
    return None if not stat else stat.get("median")


def render(result: dict[str, Any], console: Console) -> None:
    env = result["environment"]
    sc = result["scenario"]
    settings = env.get("server_settings", {})
    console.print(
        f"[bold]queuectl bench --scenario {sc['name']}[/]  {env['cpu_count']} cores, load average "
        f"{_load(env.get('load_average'))} at start, {_load(sc.get('load_average_end'))} at end; PostgreSQL "
        f"{settings.get('server_version', '?')}, synchronous_commit={settings.get('synchronous_commit', '?')}, "
        f"shared_buffers={settings.get('shared_buffers', '?')}; medians of {result['options']['repeat']} repeat(s)",
        highlight=False,
    )
    if sc.get("ceilings"):
        t = Table(title="server ceilings (pgbench, same run)", title_justify="left")
        for col in ("ceiling", "clients", "per second"):
            t.add_column(col, justify="right" if col != "ceiling" else "left")
        for c in sc["ceilings"]:
            t.add_row(c["name"], str(c["clients"]), _num(_med(c["rate"])))
        console.print(t)
    if sc.get("rows"):
        console.print(rows_table(sc))
    if sc.get("targets"):
        t = Table(title="targets", title_justify="left")
        for col in ("target", "value", "goal", "met"):
            t.add_column(col)
        for tg in sc["targets"]:
            value, goal = tg.get("value"), tg.get("threshold")
            fmt = _pct if goal is not None and goal <= 1.0 else (lambda v: _num(v, 2) + "x" if v is not None else "-")
            met = {True: "[green]yes[/]", False: "[red]no[/]", None: "not measured"}[tg.get("met")]
            t.add_row(tg["name"], fmt(value), (">= " + fmt(goal)) if goal is not None else "-", met)
        console.print(t)
    for u in sc.get("unavailable", []):
        console.print(Text(f"not measured: {u['subject']}: {u['reason']}", style="yellow"))
    for note in sc.get("notes", []):
        console.print(Text(f"note: {note}", style="dim"))


def rows_table(sc: dict[str, Any]) -> Table:
    """One line per measured row; a scenario names the extra metrics worth a column."""
    extra = sc.get("display_metrics", [])
    t = Table(title=sc.get("description", sc["name"]), title_justify="left")
    for col, justify in (
        ("subject", "left"), ("phase", "left"), ("batch", "right"), ("P+C", "right"), ("bytes", "right"),
        ("msgs/s", "right"), ("SQL ceiling", "right"), ("share", "right"), ("p50 ms", "right"), ("p99 ms", "right"),
    ):
        t.add_column(col, justify=justify)
    for name, _ in extra:
        t.add_column(name, justify="right")
    for row in sc["rows"]:
        p = row["params"]
        lat = row.get("latency_ms") or {}
        ceiling = row.get("ceiling") or {}
        cells = [
            row["subject"], row["phase"], str(p.get("batch", "-")),
            f"{p.get('producers', 0)}+{p.get('consumers', 0)}", f"{p.get('payload_bytes', '-')}",
            _num(_med(row.get("rate"))), _num(_med(ceiling.get("rate"))),
            _pct(_med(row.get("fraction_of_ceiling"))),
            _num(_med(lat.get("p50")), 1), _num(_med(lat.get("p99")), 1),
        ]
        for _, key in extra:
            value = _med(row.get("metrics", {}).get(key))
            digits = 2 if value is not None and abs(value) < 10 else 0
            cells.append(_pct(value) if key.startswith("fraction") else _num(value, digits))
        t.add_row(*cells)
    return t


def _load(values: list[float] | None) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"



def markdown(result: dict[str, Any]) -> str:
    """The same tables as Markdown, for bench/RESULTS.md and the README."""
    env, sc = result["environment"], result["scenario"]
    lines = [
        f"`{' '.join(result['command'])}`" if result.get("command") else "",
        "",
        f"{env['cpu_count']} cores; load average {_load(env.get('load_average'))} at start, "
        f"{_load(sc.get('load_average_end'))} at end; medians of {result['options']['repeat']} repeats.",
        "",
    ]
    if sc.get("ceilings"):
        lines += ["| ceiling (pgbench) | clients | per second | repeats |", "|---|---:|---:|---|"]
        for c in sc["ceilings"]:
            lines.append(f"| {c['name']} | {c['clients']} | {_num(_med(c['rate']))} | {_values(c['rate'])} |")
        lines.append("")
    extra = sc.get("display_metrics", [])
    head = ["subject", "phase", "batch", "P+C", "bytes", "msgs/s", "repeats", "SQL ceiling", "share", "p50 ms", "p99 ms"]
    head += [name for name, _ in extra]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sc.get("rows", []):
        p, lat, ceiling = row["params"], row.get("latency_ms") or {}, row.get("ceiling") or {}
        cells = [
            row["subject"] + (f" ({p['setting']})" if p.get("setting") else ""), row["phase"], str(p.get("batch", "-")),
            f"{p.get('producers', 0)}+{p.get('consumers', 0)}", str(p.get("payload_bytes", "-")),
            _num(_med(row["rate"])), _values(row["rate"]), _num(_med(ceiling.get("rate"))),
            _pct(_med(row.get("fraction_of_ceiling"))), _num(_med(lat.get("p50")), 1), _num(_med(lat.get("p99")), 1),
        ]
        for _, key in extra:
            value = _med(row.get("metrics", {}).get(key))
            digits = 2 if value is not None and abs(value) < 10 else 0
            cells.append(_pct(value) if key.startswith("fraction") else _num(value, digits))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for tg in sc.get("targets", []):
        value, goal = tg.get("value"), tg.get("threshold")
        shown = (_pct(value) if goal is not None and goal <= 1.0 else (f"{value:.2f}x" if value is not None else "-"))
        goal_shown = (_pct(goal) if goal is not None and goal <= 1.0 else f"{goal:.2f}x") if goal is not None else "-"
        met = {True: "**met**", False: "**missed**", None: "not measured"}[tg.get("met")]
        lines.append(f"- target: {tg['name']}: {shown} (goal >= {goal_shown}): {met}")
    for u in sc.get("unavailable", []):
        lines.append(f"- not measured: {u['subject']}: {u['reason']}")
    return "\n".join(lines) + "\n"


def _values(stat: dict[str, Any] | None) -> str:
    if not stat:
        return "-"
    return " / ".join(_num(v) for v in stat.get("values", []))
