"""PNG curves of `queuectl bench --scenario cost`: the backlog curve and the payload curve.

matplotlib is imported here only, when plots are asked for (the `bench` extra:
pip install 'queuectl[bench]'); the scenario checks it is there before it measures.
Each point is the median of the repeats, its bar the lowest to the highest repeat.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _curve(ax: Any, xs: list[float], stats: list[dict[str, Any]], label: str) -> None:
    """Medians joined by a line, each with a bar from its lowest to its highest repeat."""
    med = [float("nan") if s["median"] is None else s["median"] for s in stats]
    kept = [[v for v in s["values"] if v is not None] for s in stats]
    low = [m - min(v) if v else 0.0 for m, v in zip(med, kept)]
    high = [max(v) - m if v else 0.0 for m, v in zip(med, kept)]
    ax.errorbar(xs, med, yerr=[low, high], marker="o", capsize=3, linewidth=1.2, label=label)


def _axes(ax: Any, xs: list[int], label: str, title: str, compact: Any) -> None:
    """A log x axis ticked at the measured points only, a y axis from 0 with room above."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(xs, [compact(x) for x in xs])
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    ax.set_xlabel(label)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _rows(n: int) -> str:
    return f"{n / 1_000_000:g}M" if n >= 1_000_000 else f"{n / 1000:g}k" if n >= 1000 else str(n)


def _bytes(n: int) -> str:
    return f"{n / 1024:g} KB" if n >= 1024 else f"{n} B"


def _save(fig: Any, plt: Any, path: Path, title: str) -> str:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_backlog(path: Path, points: list[dict[str, Any]], options: Any) -> str:
    """Claim+ack cost per message (the consumer's wall time, the server's time in the calls, their
    shared buffers) against ready rows, log scale."""
    plt = _pyplot()
    panels = (("us_per_msg", "claim+ack, consumer's wall time (us/msg)"),
              ("server_us_per_msg", "server time in the claim and ack calls (us/msg)"),
              ("buffers_per_msg", "shared buffers per message"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for kind in dict.fromkeys(p["kind"] for p in points):
            mine = [p for p in points if p["kind"] == kind]
            _curve(ax, [p["rows"] for p in mine], [p[key] for p in mine], kind)
        _axes(ax, sorted({p["rows"] for p in points}), "ready messages in the queue", title, _rows)
    return _save(fig, plt, path, f"queuectl bench --scenario cost: backlog ({options.payload_bytes:,} B payloads, "
                                 f"one consumer, dequeue({options.batch}) + ack, {options.items:,} messages per point)")


def plot_payload(path: Path, points: list[dict[str, Any]], options: Any) -> str:
    """Full-cycle msgs/s and MB/s, claim+ack cost and WAL per message against payload size, log scale."""
    plt = _pyplot()
    panels = (("cycle", "rate", "full cycle (msgs/s)"), ("cycle", "mb_per_s", "full cycle (payload MB/s)"),
              ("claim_ack", "us_per_msg", "claim+ack wall time (us/msg)"),
              ("cycle", "wal_per_msg", "WAL per message, enqueue + claim + ack (bytes)"))
    fig, axes = plt.subplots(2, 2, figsize=(10.4, 7.2), squeeze=False)
    for ax, (part, key, title) in zip([a for row in axes for a in row], panels):
        for kind in dict.fromkeys(p["kind"] for p in points):
            mine = [p for p in points if p["kind"] == kind]
            _curve(ax, [p["payload_bytes"] for p in mine], [p[part][key] for p in mine], kind)
        _axes(ax, sorted({p["payload_bytes"] for p in points}), "payload size", title, _bytes)
    return _save(fig, plt, path, f"queuectl bench --scenario cost: payload size ({options.producers} producers + "
                                 f"{options.consumers} consumers at batch {options.batch}; claim+ack: one consumer)")
