"""Rich tables for a bench result document: every figure beside the ceiling that bounds it."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def write_json(path: str | None, result: Any, *, default: Any = None) -> None:
    """A probe's `--json FILE`: its result as indented JSON; nothing when no file was given."""
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2, default=default)


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _pct(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}%"


def _med(stat: dict[str, Any] | None) -> float | None:
    return None if not stat else stat.get("median")


def render(result: dict[str, Any], console: Console) -> None:
    env = result["environment"]
    sc = result["scenario"]
    settings = env.get("server_settings", {})
    console.print(Text.assemble(
        (f"queuectl bench --scenario {sc['name']}", "bold"), f"  {env['cpu_count']} cores, load average "
        f"{_load(env.get('load_average'))} at start, {_load(sc.get('load_average_end'))} at end; PostgreSQL "
        f"{settings.get('server_version', '?')}, synchronous_commit={settings.get('synchronous_commit', '?')}, "
        f"shared_buffers={settings.get('shared_buffers', '?')}"
        + ("" if sc.get("sustained") else f"; medians of {result['options']['repeat']} repeat(s)"),
    ), highlight=False)
    if sc.get("ceilings"):
        t = Table(title="server ceilings (pgbench, same run)", title_justify="left")
        for col in ("ceiling", "clients", "per second"):
            t.add_column(col, justify="right" if col != "ceiling" else "left")
        for c in sc["ceilings"]:
            t.add_row(c["name"], str(c["clients"]), _num(_med(c["rate"])))
        console.print(t)
    if sc.get("sustained"):
        console.print(sustained_table(sc))
    elif sc.get("cost"):
        for title, table in cost_tables(sc):
            console.print(Text(title, style="bold"))
            console.print(table)
    elif sc.get("rows"):
        console.print(rows_table(sc))
    if sc.get("targets"):
        t = Table(title="targets", title_justify="left")
        verdicts = any(tg.get("verdict") for tg in sc["targets"])
        for col in ("target", "value", "goal", "met", *(("verdict",) if verdicts else ())):
            t.add_column(col)
        for tg in sc["targets"]:
            value, goal = tg.get("value"), tg.get("threshold")
            met = {True: Text("yes", "green"), False: Text("no", "red"), None: "not measured"}[tg.get("met")]
            cells = [tg["name"], _target_value(value, goal), _target_goal(tg), met]
            t.add_row(*cells, *((tg.get("verdict") or "-",) if verdicts else ()))
        console.print(t)
    for design, soak in (sc.get("soak") or {}).items():
        console.print(soak_table(design, soak))
    for u in sc.get("unavailable", []):
        console.print(Text(f"not measured: {u['subject']}: {u['reason']}", style="yellow"))
    for note in sc.get("notes", []):
        console.print(Text(f"note: {note}", style="dim"))


def _metric(key: str, value: float | None) -> str:
    """A fraction as a percentage, a whole count as is, a small factor with two decimals."""
    if key.startswith("fraction"):
        return _pct(value)
    digits = 2 if value is not None and abs(value) < 10 and value != int(value) else 0
    return _num(value, digits)


def _target_value(value: float | None, goal: float | None) -> str:
    """A share (goal up to 100%) as a percentage, a count (goal 0) as is, else a factor;
    with one more digit when the usual ones would show a value on the other side of its
    goal as the goal itself (0.949 as 95% beside a goal of 95%)."""
    if goal is not None and goal == 0:
        return _num(value)
    if value is None:
        return "-"
    if goal is not None and goal <= 1.0:
        return _pct(value, 1 if value != goal and _pct(value) == _pct(goal) else 0)
    digits = 3 if goal is not None and value != goal and _num(value, 2) == _num(goal, 2) else 2
    return _num(value, digits) + "x"


def _target_goal(tg: dict[str, Any]) -> str:
    goal = tg.get("threshold")
    if goal is None:
        return "-"
    return f"{tg.get('comparison', '>=')} {_target_value(goal, goal)}"


def soak_table(design: str, soak: dict[str, Any]) -> Table:
    """Size over time of one design's soak, with the HOT share of its updates so far."""
    verdict = "constant" if soak["constant"] else "NOT constant"
    if design != "ring":
        grown = soak["end_total_bytes"] - soak["start_total_bytes"]
        verdict = f"grew {grown:+,} bytes" if grown else "constant"
    hot = soak.get("hot_ratio")
    title = (f"soak {design}: {soak['seconds']:g} s at batch {soak['batch']}, {soak['rate']:,.0f} msgs/s; size {verdict}; "
             f"HOT {'-' if hot is None else f'{hot:.3f}'} ({soak['hot_updates']:,} of {soak['updates']:,} updates; "
             f"after the first lap {'-' if soak.get('steady_hot_ratio') is None else format(soak['steady_hot_ratio'], '.3f')}); "
             f"lost {soak['ledger']['lost']}, orphaned {soak['ledger']['orphaned']} "
             f"(brought back by ring_repair: {soak['ledger'].get('repaired', 0)})")
    t = Table(title=title, title_justify="left")
    index_names = sorted({name for s in soak["samples"] for name in s["indexes"]})
    for col in ["t s", "laps", "total bytes", "heap bytes", *index_names, "ins", "upd", "HOT upd", "del", "dead"]:
        t.add_column(col.rsplit(".", 1)[-1].strip('"'), justify="right")
    for s in soak["samples"]:
        t.add_row(
            f"{s['t']:.1f}", "-" if s.get("laps") is None else f"{s['laps']:.2f}", _num(s["total_bytes"]),
            _num(s["heap_bytes"]), *[_num(s["indexes"].get(n)) for n in index_names], _num(s["n_tup_ins"]),
            _num(s["n_tup_upd"]), _num(s["n_tup_hot_upd"]), _num(s["n_tup_del"]), _num(s["n_dead_tup"]),
        )
    return t


HOLD_LABEL = {"none": "none", "snapshot": "snapshot", "idle-in-transaction": "idle-in-tx"}
# (header, summary key or a function of the run): the console table, then the Markdown one
SUSTAINED_CONSOLE = ("kind", "hold", "done/s", "x clean", "backlog /min", "p99 ms", "dead rows", "MB", "refused")
SUSTAINED_MARKDOWN = ("kind", "hold", "done/s", "x clean", "backlog /min", "p50 ms", "p99 ms", "dead rows",
                      "MB start->end", "refused")


def _sustained_cells(run: dict[str, Any], columns: tuple[str, ...]) -> list[str]:
    """One sustained run's summary, in the given columns."""
    s = run["summary"]
    ratio_, start, end = s["held_over_clean"], s["total_bytes_start"], s["total_bytes_end"]
    p99 = s["latency_p99_ms"]
    cells = {
        "kind": run["kind"], "hold": HOLD_LABEL[run["hold"]], "done/s": _num(s["completed_per_s"]),
        "x clean": "-" if ratio_ is None else f"{ratio_:.2f}x", "backlog /min": _num(_no_minus_zero(s["backlog_slope_per_min"])),
        "p50 ms": _num(s["latency_p50_ms"], 1), "p99 ms": _num(p99, 1 if p99 is not None and p99 < 100 else 0),
        "dead rows": _num(s["dead_rows_end"]), "MB": "-" if end is None else f"{end / 1_048_576:.1f}",
        "MB start->end": "-" if start is None or end is None else f"{start / 1_048_576:.1f} -> {end / 1_048_576:.1f}",
        "refused": _num(s["refused"]),
    }
    return [cells[c] for c in columns]


def _no_minus_zero(value: float | None) -> float | None:
    """A slope that rounds to 0 reads "0", not "-0"."""
    return None if value is None else (0.0 if round(value) == 0 else value)


def sustained_table(sc: dict[str, Any]) -> Table:
    """The sustained runs, one line each, within 80 columns (size: at the end of the run)."""
    su = sc["sustained"]
    seconds = su["runs"][0]["seconds"] if su["runs"] else 0
    t = Table(title=f"sustained: {su['offered_rate']:,.0f} msgs/s offered, {seconds:g} s per run",
              title_justify="left", box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    for col in SUSTAINED_CONSOLE:
        t.add_column(col, justify="left" if col in ("kind", "hold") else "right", no_wrap=col in ("kind", "hold"))
    for run in su["runs"]:
        t.add_row(*_sustained_cells(run, SUSTAINED_CONSOLE))
    return t


def sustained_markdown(sc: dict[str, Any]) -> list[str]:
    lines = ["| " + " | ".join(SUSTAINED_MARKDOWN) + " |", "|---|---|" + "---:|" * (len(SUSTAINED_MARKDOWN) - 2)]
    return lines + ["| " + " | ".join(_sustained_cells(run, SUSTAINED_MARKDOWN)) + " |" for run in sc["sustained"]["runs"]]


# (header, where the figure is, digits): the cost scenario's two curves, console and Markdown;
# then the figure whose repeats the Markdown shows beside the median
COST_BACKLOG = (("kind", "kind", None), ("ready", "rows", 0), ("us/msg", "us_per_msg", 1),
                ("x smallest", "over_smallest", 2), ("srv us", "server_us_per_msg", 1), ("x srv", "server_over_smallest", 2),
                ("buf/msg", "buffers_per_msg", 1), ("x buf", "buffers_over_smallest", 2))
COST_BACKLOG_MARKDOWN = (*COST_BACKLOG, ("msgs/s", "rate", 0), ("WAL B/msg", "wal_bytes_per_msg", 0))
COST_PAYLOAD = (("kind", "kind", None), ("bytes", "payload_bytes", 0), ("cycle/s", "cycle.rate", 0),
                ("MB/s", "cycle.mb_per_s", 1), ("WAL B/msg", "cycle.wal_per_msg", 0),
                ("claim us/msg", "claim_ack.us_per_msg", 1), ("buf/msg", "claim_ack.buffers_per_msg", 1))
COST_REPEATS = (("us/msg", "us_per_msg", 1), ("cycle/s", "cycle.rate", 0))


def _at(point: dict[str, Any], where: str) -> Any:
    """point["a"]["b"] for where "a.b"."""
    value: Any = point
    for key in where.split("."):
        value = value[key]
    return value


def _cost_cell(point: dict[str, Any], where: str, digits: int | None) -> str:
    value = _at(point, where)
    if digits is None:
        return str(value)
    if isinstance(value, dict):  # a stat: its median
        value = value["median"]
        if where.endswith("over_smallest"):
            return "-" if value is None else f"{value:.2f}x"
    return _num(value, digits)


def _cost_curves(sc: dict[str, Any], markdown: bool = False
                 ) -> list[tuple[str, tuple[Any, ...], tuple[str, str, int], list[dict[str, Any]]]]:
    """(title, columns, repeated figure, points) of each curve the run measured."""
    c = sc["cost"]
    titles = (f"backlog: one consumer, dequeue({c['batch']}) + ack of {c['items']:,} messages of "
              f"{c['payload_bytes']:,} B per point",
              f"payload: full cycle (cycle/s, MB/s, WAL per message), then claim+ack of {c['items']:,}")
    curves = zip(titles, (COST_BACKLOG_MARKDOWN if markdown else COST_BACKLOG, COST_PAYLOAD), COST_REPEATS,
                 (c["backlog"], c["payload"]))
    return [curve for curve in curves if curve[3]]


def cost_tables(sc: dict[str, Any]) -> list[tuple[str, Table]]:
    """The cost scenario's curves, each a title and a table of one line per point within 80
    columns (the title is printed above it, wrapped at the console's width)."""
    tables = []
    for title, columns, _, points in _cost_curves(sc):
        t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
        for header, _, digits in columns:
            t.add_column(header, justify="left" if digits is None else "right", no_wrap=digits is None)
        for p in points:
            t.add_row(*(_cost_cell(p, where, digits) for _, where, digits in columns))
        tables.append((title, t))
    return tables


def cost_markdown(sc: dict[str, Any]) -> list[str]:
    """The same curves as Markdown, each point's repeats beside its median."""
    lines: list[str] = []
    for title, columns, (header, where, digits), points in _cost_curves(sc, markdown=True):
        head = [h for h, _, _ in columns] + [f"{header} repeats"]
        lines += [f"{title[0].upper()}{title[1:]}:", "", "| " + " | ".join(head) + " |",
                  "|---|" + "---:|" * (len(head) - 2) + "---|"]
        for p in points:
            repeats = " / ".join(_num(v, digits) for v in _at(p, where)["values"])
            lines.append("| " + " | ".join([*(_cost_cell(p, w, d) for _, w, d in columns), repeats]) + " |")
        lines.append("")
    return lines


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
            _subject(row), row["phase"], str(p.get("batch", "-")),
            f"{p.get('producers', 0)}+{p.get('consumers', 0)}", f"{p.get('payload_bytes', '-')}",
            _num(_med(row.get("rate"))), _num(_med(ceiling.get("rate"))),
            _pct(_med(row.get("fraction_of_ceiling"))),
            _num(_med(lat.get("p50")), 1), _num(_med(lat.get("p99")), 1),
        ]
        for _, key in extra:
            cells.append(_metric(key, _med(row.get("metrics", {}).get(key))))
        t.add_row(*cells)
    return t


def _subject(row: dict[str, Any]) -> str:
    """The subject with its setting (peers: each peer runs at several), so rows stay apart."""
    setting = row["params"].get("setting")
    return row["subject"] + (f" ({setting})" if setting else "")


def _load(values: list[float] | None) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"



def markdown(result: dict[str, Any]) -> str:
    """The same tables as Markdown, for the lab notebook (bench/lab/RESULTS.md) and the README."""
    env, sc = result["environment"], result["scenario"]
    lines = [
        f"`{' '.join(result['command'])}`" if result.get("command") else "",
        "",
        f"{env['cpu_count']} cores; load average {_load(env.get('load_average'))} at start, "
        f"{_load(sc.get('load_average_end'))} at end"
        + ("." if sc.get("sustained") else f"; medians of {result['options']['repeat']} repeats."),
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
    if sc.get("sustained"):
        lines += sustained_markdown(sc)
    elif sc.get("cost"):
        lines += cost_markdown(sc)
    else:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in [] if sc.get("sustained") or sc.get("cost") else sc.get("rows", []):
        p, lat, ceiling = row["params"], row.get("latency_ms") or {}, row.get("ceiling") or {}
        cells = [
            _subject(row), row["phase"], str(p.get("batch", "-")),
            f"{p.get('producers', 0)}+{p.get('consumers', 0)}", str(p.get("payload_bytes", "-")),
            _num(_med(row["rate"])), _values(row["rate"]), _num(_med(ceiling.get("rate"))),
            _pct(_med(row.get("fraction_of_ceiling"))), _num(_med(lat.get("p50")), 1), _num(_med(lat.get("p99")), 1),
        ]
        for _, key in extra:
            cells.append(_metric(key, _med(row.get("metrics", {}).get(key))))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for tg in sc.get("targets", []):
        met = {True: "**met**", False: "**missed**", None: "not measured"}[tg.get("met")]
        lines.append(f"- target: {tg['name']}: {_target_value(tg.get('value'), tg.get('threshold'))} "
                     f"(goal {_target_goal(tg)}): {met}" + (f"; {tg['verdict']}" if tg.get("verdict") else ""))
    for design, soak in (sc.get("soak") or {}).items():
        lines += ["", soak_markdown(design, soak)]
    for u in sc.get("unavailable", []):
        lines.append(f"- not measured: {u['subject']}: {u['reason']}")
    return "\n".join(lines) + "\n"


def soak_markdown(design: str, soak: dict[str, Any]) -> str:
    index_names = sorted({name for s in soak["samples"] for name in s["indexes"]})
    head = ["t s", "laps", "total bytes", *[n.rsplit(".", 1)[-1].strip('"') for n in index_names], "upd", "HOT upd", "dead"]
    hot = soak.get("hot_ratio")
    if design == "ring":
        verdict = f"sizes after the first lap: {'constant' if soak['constant'] else 'NOT constant'}"
    else:
        verdict = f"total size {soak['start_total_bytes']:,} -> {soak['end_total_bytes']:,} bytes"
    lines = [f"Soak `{design}`: {soak['seconds']:g} s at batch {soak['batch']}, {soak['rate']:,.0f} msgs/s, "
             f"HOT ratio {'-' if hot is None else f'{hot:.3f}'} (after the first lap: "
             f"{'-' if soak.get('steady_hot_ratio') is None else format(soak['steady_hot_ratio'], '.3f')}), {verdict}, "
             f"lost {soak['ledger']['lost']}, orphaned {soak['ledger']['orphaned']} "
             f"(brought back by ring_repair: {soak['ledger'].get('repaired', 0)})", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for s in soak["samples"]:
        lines.append("| " + " | ".join([f"{s['t']:.1f}", "-" if s.get("laps") is None else f"{s['laps']:.2f}",
                                         _num(s["total_bytes"]), *[_num(s["indexes"].get(n)) for n in index_names],
                                         _num(s["n_tup_upd"]), _num(s["n_tup_hot_upd"]), _num(s["n_dead_tup"])]) + " |")
    return "\n".join(lines) + "\n"


def _values(stat: dict[str, Any] | None) -> str:
    if not stat:
        return "-"
    return " / ".join(_num(v) for v in stat.get("values", []))
