"""PNG plots of records: throughput vs p99 with the Pareto front per target, and best throughput by each
swept parameter. A bare matplotlib Figure renders with Agg and never opens a display."""

import math
import re
from pathlib import Path

from segserve.bench.results.render import cell, header


def plot_name(kind: str, name: str) -> str:
    """plots/<file> of a target's Pareto plot ("throughput_vs_p99") or a parameter's ("throughput_by")."""
    safe = re.sub(r"[^\w.-]", "_", str(name))
    return f"{kind}_{safe}.png"


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (throughput, p99) that no other point beats on both: scan by throughput descending, keep new p99 minima."""
    front, lowest_p99 = [], math.inf
    for throughput, p99 in sorted(points, key=lambda p: (-p[0], p[1])):
        if p99 < lowest_p99:
            front.append((throughput, p99))
            lowest_p99 = p99
    return sorted(front)


def plot_pareto(path: Path, target: str, records: list[dict], winner: dict | None) -> None:
    from matplotlib.figure import Figure  # a bare Figure renders with Agg and never opens a display

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    points = [
        (r["throughput_rps"], r["latency_p99_ms"])
        for r in records
        if r.get("throughput_rps") is not None and r.get("latency_p99_ms") is not None
    ]
    if points:
        ax.scatter(*zip(*points, strict=True), color="tab:blue", label="run points")
        ax.plot(*zip(*pareto_front(points), strict=True), color="tab:orange", marker="o", label="Pareto front")
    else:
        ax.text(0.5, 0.5, "no measured points", ha="center", va="center", transform=ax.transAxes)
    if winner is not None and winner.get("throughput_rps") is not None and winner.get("latency_p99_ms") is not None:
        ax.scatter([winner["throughput_rps"]], [winner["latency_p99_ms"]], s=200, marker="*", color="tab:red", zorder=3, label="best")
    ax.set(title=f"{target}: throughput vs p99 latency", xlabel=header("throughput_rps"), ylabel=header("latency_p99_ms"))
    if points:
        ax.legend()
    fig.savefig(path, dpi=100)


def plot_by_param(path: Path, param: str, records: list[dict], targets: list[str]) -> None:
    from matplotlib.figure import Figure

    # values may be numbers, strings, None or even lists: key them by text, order numbers numerically
    values = {str(r.get(param)): r.get(param) for r in records}
    labels = sorted(values, key=lambda k: (0, values[k], k) if isinstance(values[k], int | float) else (1, 0, k))
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for target in targets:
        # other parameters vary too: show the best throughput each value reached
        best_rps = {}
        for r in records:
            if r.get("target") == target and r.get("throughput_rps") is not None:
                label = str(r.get(param))
                best_rps[label] = max(best_rps.get(label, 0), r["throughput_rps"])
        xs = [i for i, label in enumerate(labels) if label in best_rps]
        if xs:
            ax.plot(xs, [best_rps[labels[i]] for i in xs], marker="o", label=target)
    ax.set_xticks(range(len(labels)), [cell(values[k]) for k in labels])
    ax.set(title=f"best throughput by {param}", xlabel=param, ylabel=header("throughput_rps"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.savefig(path, dpi=100)
