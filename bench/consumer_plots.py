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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    counts: list[int] = []
    for phase, label, colour in PHASES:
        points = sorted((row["params"]["consumers"], row["rate"]) for row in rows if row["phase"] == phase)
        counts = [n for n, _ in points]
        rates.plot(counts, [r["median"] for _, r in points], marker="o", linewidth=1.5, color=colour,
                   label=f"{label} (median of {repeat})")
        for n, r in points:
            values = [v for v in r["values"] if v is not None]
            rates.scatter([n] * len(values), values, s=10, alpha=0.35, color=colour)
    for metric, label, colour in CPU:
        points = sorted((row["params"]["consumers"], row["metrics"][metric]["median"]) for row in rows
                        if row["phase"] == "full-cycle")
        cpu.plot([n for n, _ in points], [float("nan") if v is None else v for _, v in points], marker="o",
                 linewidth=1.5, color=colour, label=label)
    for ax, title, unit in ((rates, "messages per second", "msgs/s"),
                            (cpu, "full cycle: worker processes' CPU per 1,000 messages", "CPU s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("consumer processes")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    detail = "" if seconds is None else f", {seconds:g} s phases"
    if upkeep is not None:
        detail += ", upkeep job beside" if upkeep else ", no upkeep job"
    fig.suptitle(f"queuectl bench --scenario consumers: {kind}, {producers} producers, batch {batch}{detail}",
                 fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# (archive_job, label, colour) of the archive curve's rate lines
ARCHIVE_MODES = ((False, "no archive job", "tab:blue"), (True, "archive job beside", "tab:orange"))


def plot_archive_curve(path: Path, rows: list[dict[str, Any]], *, producers: int, batch: int, repeat: int,
                       seconds: float, goal: float) -> None:
    """Two panels by consumer count: the full cycle's msgs/s with the archive job beside and
    without (median line, each repeat a dot); and the rate with it over the rate without in the
    same repeat, beside the goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, share) = plt.subplots(1, 2, figsize=(11, 4.2))
    counts: list[int] = []
    for job, label, colour in ARCHIVE_MODES:
        points = sorted((row["params"]["consumers"], row["rate"]) for row in rows
                        if row["params"]["archive_job"] == job)
        counts = [n for n, _ in points]
        rates.plot(counts, [r["median"] for _, r in points], marker="o", linewidth=1.5, color=colour,
                   label=f"{label} (median of {repeat})")
        for n, r in points:
            values = [v for v in r["values"] if v is not None]
            rates.scatter([n] * len(values), values, s=10, alpha=0.35, color=colour)
    quotients = sorted((row["params"]["consumers"], row["metrics"]["vs_without"]) for row in rows
                       if row["params"]["archive_job"])
    share.plot([n for n, _ in quotients], [float("nan") if q["median"] is None else q["median"] for _, q in quotients],
               marker="o", linewidth=1.5, color="tab:orange", label=f"with / without (median of {repeat})")
    for n, q in quotients:
        values = [v for v in q["values"] if v is not None]
        share.scatter([n] * len(values), values, s=10, alpha=0.35, color="tab:orange")
    share.axhline(goal, linestyle="--", linewidth=1, color="tab:gray", label=f"goal {goal:g}x")
    for ax, title, unit in ((rates, "full cycle: messages per second", "msgs/s"),
                            (share, "rate with the archive job / without it, same repeat", "ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("consumer processes")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"queuectl bench --scenario archive: reliable, {producers} producers, batch {batch}, "
                 f"{seconds:g} s runs", fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
