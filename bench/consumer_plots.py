"""PNGs of `queuectl bench --scenario consumers` (one kind's rates by consumer count) and of
`--scenario archive` (the full cycle with the archive job beside and without, by consumer count).

matplotlib is imported here only, when plots are asked for (the `bench` extra:
pip install 'queuectl[bench]'), as in sustained_plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (phase, label, colour) of the rate panel's lines
PHASES = (("full-cycle", "full cycle", "tab:blue"), ("dequeue-only", "dequeue-only", "tab:orange"))
# (metric, label, colour) of the CPU panel's lines (full cycle)
CPU = (("producer_cpu", "producers", "tab:green"), ("consumer_cpu", "consumers", "tab:red"))


def plot_curve(path: Path, kind: str, rows: list[dict[str, Any]], *, producers: int, batch: int, repeat: int,
               seconds: float | None = None, upkeep: bool | None = None) -> None:
    """Two panels: msgs/s by consumer count (median line, each repeat a dot), full cycle and
    dequeue-only; and the full cycle's worker CPU per 1,000 messages, producers and consumers."""
    plt = _pyplot()
    fig, (rates, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    counts: list[int] = []
    for phase, label, colour in PHASES:
        points = sorted((row["params"]["consumers"], row["rate"]) for row in rows if row["phase"] == phase)
        counts = [n for n, _ in points]
        _medians_and_repeats(rates, points, colour, f"{label} (median of {repeat})")
    for metric, label, colour in CPU:
        points = sorted((row["params"]["consumers"], row["metrics"][metric]["median"]) for row in rows
                        if row["phase"] == "full-cycle")
        cpu.plot([n for n, _ in points], [float("nan") if v is None else v for _, v in points], marker="o",
                 linewidth=1.5, color=colour, label=label)
    detail = "" if seconds is None else f", {seconds:g} s phases"
    if upkeep is not None:
        detail += ", upkeep job beside" if upkeep else ", no upkeep job"
    _finish(plt, fig, path, counts, ((rates, "messages per second", "msgs/s"),
                                     (cpu, "full cycle: worker processes' CPU per 1,000 messages", "CPU s")),
            f"queuectl bench --scenario consumers: {kind}, {producers} producers, batch {batch}{detail}")


# (archive_job, label, colour) of the archive curve's rate lines
ARCHIVE_MODES = ((False, "no archive job", "tab:blue"), (True, "archive job beside", "tab:orange"))


def plot_archive_curve(path: Path, rows: list[dict[str, Any]], *, producers: int, batch: int, repeat: int,
                       seconds: float, goal: float) -> None:
    """Two panels by consumer count: the full cycle's msgs/s with the archive job beside and
    without (median line, each repeat a dot); and the rate with it over the rate without in the
    same repeat, beside the goal."""
    plt = _pyplot()
    fig, (rates, share) = plt.subplots(1, 2, figsize=(11, 4.2))
    counts: list[int] = []
    for job, label, colour in ARCHIVE_MODES:
        points = sorted((row["params"]["consumers"], row["rate"]) for row in rows
                        if row["params"]["archive_job"] == job)
        counts = [n for n, _ in points]
        _medians_and_repeats(rates, points, colour, f"{label} (median of {repeat})")
    quotients = sorted((row["params"]["consumers"], row["metrics"]["vs_without"]) for row in rows
                       if row["params"]["archive_job"])
    _medians_and_repeats(share, quotients, "tab:orange", f"with / without (median of {repeat})")
    share.axhline(goal, linestyle="--", linewidth=1, color="tab:gray", label=f"goal {goal:g}x")
    _finish(plt, fig, path, counts, ((rates, "full cycle: messages per second", "msgs/s"),
                                     (share, "rate with the archive job / without it, same repeat", "ratio")),
            f"queuectl bench --scenario archive: reliable, {producers} producers, batch {batch}, {seconds:g} s runs")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _medians_and_repeats(ax: Any, points: list[tuple[int, dict[str, Any]]], colour: str, label: str) -> None:
    """A stat (median, values) per consumer count: its medians as a line, each repeat a dot."""
    ax.plot([n for n, _ in points], [float("nan") if p["median"] is None else p["median"] for _, p in points],
            marker="o", linewidth=1.5, color=colour, label=label)
    for n, p in points:
        values = [v for v in p["values"] if v is not None]
        ax.scatter([n] * len(values), values, s=10, alpha=0.35, color=colour)


def _finish(plt: Any, fig: Any, path: Path, counts: list[int], panels: Any, title: str) -> None:
    """Each panel's axes (consumer counts on a log-2 scale, from zero up), the title, the file."""
    for ax, panel_title, unit in panels:
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("consumer processes")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(panel_title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
