"""PNG plots of `queuectl bench --scenario sustained`: per kind, its runs side by side.

matplotlib is imported here only, when plots are asked for (the `bench` extra:
pip install 'queuectl[bench]'); the scenario checks it is there before it measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (series field, panel title, scale, unit): one row of panels each, every run in its own column
PANELS = (
    ("completed_per_s", "completed", 1.0, "msgs/s"),
    ("backlog", "backlog (ready)", 1.0, "messages"),
    ("latency_p99_ms", "end-to-end latency p99", 1.0, "ms"),
    ("dead_rows", "dead row versions (queue's tables)", 1.0, "rows"),
    ("total_bytes", "size (tables + indexes + TOAST)", 1.0 / 1_048_576, "MB"),
    ("bystander_ms", "bystander query (1M-row table)", 1.0, "ms"),
)
HOLD_TITLE = {"none": "clean", "snapshot": "snapshot held (REPEATABLE READ)",
              "idle-in-transaction": "idle in transaction (xid held)"}


def plot_kind(path: Path, kind: str, runs: list[dict[str, Any]], rate: float) -> None:
    """One PNG: a column per run of `kind` (clean, held), a row per measured series; each
    row shares its y axis, so clean and held read on the same scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = len(runs)
    fig, axes = plt.subplots(len(PANELS), cols, figsize=(5.2 * cols, 2.1 * len(PANELS)), sharex=True, sharey="row",
                             squeeze=False)
    for c, run in enumerate(runs):
        t = [s["t"] for s in run["series"]]
        summary = run["summary"]
        axes[0][c].set_title(f"{HOLD_TITLE.get(run['hold'], run['hold'])}\n"
                             f"{summary['completed_per_s']:,.0f} msgs/s done of {rate:,.0f} offered", fontsize=10)
        for r, (key, title, scale, unit) in enumerate(PANELS):
            ax = axes[r][c]
            values = [None if s[key] is None else s[key] * scale for s in run["series"]]
            ax.plot(t, [float("nan") if v is None else v for v in values], marker=".", linewidth=1.2)
            if key == "completed_per_s":
                ax.plot(t, [s["offered_per_s"] for s in run["series"]], linestyle="--", linewidth=1, color="grey",
                        label="offered")
                ax.legend(loc="lower right", fontsize=7)
            ax.grid(True, alpha=0.3)
            if c == 0:
                ax.set_ylabel(f"{title}\n({unit})", fontsize=8)
            if r == len(PANELS) - 1:
                ax.set_xlabel("seconds into the run")
            ax.tick_params(labelsize=7)
    for row in axes:  # once every column is drawn: the shared scale covers them all
        row[0].set_ylim(bottom=0)
    fig.suptitle(f"queuectl bench --scenario sustained: {kind}", fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
