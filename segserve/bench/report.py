"""Turn run records into results: summary.csv/jsonl, report.md with tables and PNG plots, efficiency, and `bench compare`.

Everything here reads records that were already measured; nothing talks to a server.
"""

import csv
import json
import math
import re
import statistics
from pathlib import Path

from segserve.bench.schema import BASE_COLUMNS, EXTRA_COLUMNS, METRICS, best, satisfies

MEMBERS = ("seg", "jpeg")
PIPELINES = ("seg_jpeg", "seg_jpeg_fused")
# the columns of the per-target tables; the full set is in summary.csv
TABLE_METRICS = ["throughput_rps", "latency_p50_ms", "latency_p99_ms", "requests_failed", "server_queue_ms", "server_cpu_pct"]
UNIT_SUFFIXES = ("_rps", "_ms", "_pct", "_mb", "_s")


def summary_columns(swept: list[str]) -> list[str]:
    fixed = BASE_COLUMNS + EXTRA_COLUMNS
    return BASE_COLUMNS + [p for p in dict.fromkeys(swept) if p not in fixed] + EXTRA_COLUMNS


def write_summary(out_dir: Path, records: list[dict], swept: list[str]) -> None:
    """summary.csv (fixed columns, one row per record, None → empty cell) and summary.jsonl (same keys)."""
    columns = summary_columns(swept)
    with open(out_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)  # the csv module writes None as an empty cell
    with open(out_dir / "summary.jsonl", "w") as f:
        for record in records:
            # numpy scalars may slip into records; a crash here would lose a finished benchmark
            f.write(json.dumps({c: record.get(c) for c in columns}, default=lambda v: v.item() if hasattr(v, "item") else str(v)) + "\n")


def read_summary(result_dir: Path) -> list[dict]:
    """The rows of a results folder's summary.jsonl (or of that file, given itself)."""
    path = Path(result_dir) if Path(result_dir).is_file() else Path(result_dir) / "summary.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no summary.jsonl here; pass a results folder written by `segserve bench` (results/<suite>/<timestamp>/)"
        )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _pick_bare(bare: list[dict], batch_size, threads, input_size=None) -> dict | None:
    """The bare forward measurement matching the batch size and input size (and threads when known, else the fastest)."""
    input_size = list(input_size or (256, 448))
    same_batch = [b for b in bare if b.get("batch_size") == batch_size and list(b.get("input_size") or (256, 448)) == input_size]
    exact = [b for b in same_batch if threads is not None and b.get("threads") == threads]
    candidates = exact or same_batch
    return max(candidates, key=lambda b: b.get("throughput_ips") or 0) if candidates else None


def served_vs_bare(records: list[dict], constraints: dict, objective: str, bare: list[dict]) -> list[dict]:
    """Per thread count (and input size), the served seg model at its best batch size against the bare
    forward at the same batch size, threads and input size. The first row is the overall winner."""
    seg = [r for r in records if r.get("target") == "seg"]
    winner = best(seg, constraints, objective)
    if winner is None:
        return []
    groups: dict[tuple, list[dict]] = {}
    for r in seg:
        groups.setdefault((r.get("omp_num_threads"), str(r.get("input_size"))), []).append(r)
    group_winners = [best(group, constraints, objective) for group in groups.values()]
    rows = []
    for point in [winner] + [w for w in group_winners if w is not None and w is not winner]:
        entry = _pick_bare(bare, point.get("batch_size"), point.get("omp_num_threads"), point.get("input_size")) or {}
        beside = point.get("bare_forward_ips")  # measured right after the point: the fairer comparison
        rows.append(
            {
                "target": "seg",
                "run_id": point["run_id"],
                "batch_size": point.get("batch_size"),
                "threads": entry.get("threads", point.get("omp_num_threads")),
                "served_rps": point.get("throughput_rps"),
                "bare_beside_rps": beside,
                "bare_end_rps": entry.get("throughput_ips"),
                "bare_end_min_rps": entry.get("throughput_min_ips"),
                "bare_end_max_rps": entry.get("throughput_max_ips"),
                "ratio_bare": ratio(point.get("throughput_rps"), beside or entry.get("throughput_ips")),
            }
        )
    return rows


def efficiency(records: list[dict], constraints: dict, objective: str, bare: list[dict]) -> list[dict]:
    """Best pipeline throughput against what its best members allow (shared or disjoint CPUs) and the bare model."""
    winners = {target: best([r for r in records if r.get("target") == target], constraints, objective) for target in MEMBERS + PIPELINES}
    seg_rps = (winners["seg"] or {}).get("throughput_rps")
    jpeg_rps = (winners["jpeg"] or {}).get("throughput_rps")
    if not seg_rps or not jpeg_rps:
        return []
    # members on the same CPUs split each second between them; on disjoint CPUs the slower one sets the pace
    shared_bound_rps = 1 / (1 / seg_rps + 1 / jpeg_rps)
    disjoint_bound_rps = min(seg_rps, jpeg_rps)
    rows = []
    for pipeline in PIPELINES:
        winner = winners[pipeline]
        if winner is None:
            continue
        pipeline_rps = winner.get("throughput_rps")
        batch_size = winner["seg_batch_size"] if winner.get("seg_batch_size") is not None else winner.get("batch_size")
        entry = _pick_bare(bare, batch_size, winner.get("omp_num_threads"), winner.get("input_size")) or {}
        bare_rps = entry.get("throughput_ips")
        rows.append(
            {
                "pipeline": pipeline,
                "pipeline_rps": pipeline_rps,
                "seg_rps": seg_rps,
                "jpeg_rps": jpeg_rps,
                "shared_bound_rps": shared_bound_rps,
                "ratio_shared": ratio(pipeline_rps, shared_bound_rps),
                "disjoint_bound_rps": disjoint_bound_rps,
                "ratio_disjoint": ratio(pipeline_rps, disjoint_bound_rps),
                "bare_rps": bare_rps,
                "ratio_bare": ratio(pipeline_rps, bare_rps),
                "bare_batch_size": entry.get("batch_size"),
                "bare_threads": entry.get("threads"),
            }
        )
    return rows


def time_breakdown(records: list[dict], constraints: dict, objective: str) -> list[dict]:
    """Where a request's time goes at each pipeline's best point, from the server's own metrics: per node
    (a workflow node, or the fused model) TorchServe's time from the job's creation to its response, the
    queue wait within it, and the handler's decode/predict/encode per request; the rest of the client's mean
    latency is the frontend's hops (HTTP, the workflow's per-request thread pool, bytes between nodes)."""
    rows = []
    for pipeline in PIPELINES:
        winner = best([r for r in records if r.get("target") == pipeline], constraints, objective)
        if winner is None or not winner.get("server_models"):
            continue
        stages = winner.get("server_stages") or {}
        processes = winner.get("server_processes") or {}
        accounted = 0.0
        for node, times in winner["server_models"].items():
            stage = stages.get(node, {})
            # TorchServe's inference latency runs from the job's creation to its response: the queue is inside it
            queue_ms, inference_ms = times.get("queue_ms") or 0.0, times.get("inference_ms") or 0.0
            accounted += inference_ms
            cpu = [v.get("cpu_pct") for k, v in processes.items() if k.split("/")[0] == node]
            rows.append(
                {
                    "pipeline": pipeline,
                    "part": node,
                    "node_ms": inference_ms,
                    "of_which_queue_ms": queue_ms,
                    "handler_ms_per_request": sum(stage.get(k) or 0.0 for k in ("decode_ms", "predict_ms", "encode_ms")) or None,
                    "cpu_pct": sum(c for c in cpu if c is not None) if cpu else None,
                }
            )
        latency = winner.get("latency_mean_ms")
        rows.append(
            {
                "pipeline": pipeline,
                "part": "frontend hops + network (rest of mean latency)",
                "node_ms": None if latency is None else latency - accounted,
                "of_which_queue_ms": None,
                "handler_ms_per_request": None,
                "cpu_pct": (processes.get("frontend") or {}).get("cpu_pct"),
            }
        )
    return rows


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"
    # a pipe or newline inside a cell (error messages) would break the table
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_table(records: list[dict], columns: list[str]) -> str:
    """A Markdown table; floats rounded for reading, None → '–'."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def _header(tag: str) -> str:
    """'latency_p99_ms' → 'latency p99 (ms)': the unit from METRICS instead of the name's suffix."""
    if tag not in METRICS:
        return tag
    name = next((tag.removesuffix(s) for s in UNIT_SUFFIXES if tag.endswith(s)), tag)
    unit = METRICS[tag].unit
    return name.replace("_", " ") if unit in name else f"{name.replace('_', ' ')} ({unit})"


def _direction(tag: str) -> str:
    return "higher is better" if METRICS[tag].higher_is_better else "lower is better"


def _constraint_text(constraints: dict) -> str:
    parts = []
    for tag, bounds in constraints.items():
        unit = METRICS[tag].unit if tag in METRICS else ""
        parts += [f"{tag} ≥ {bounds['min']} {unit}".strip()] if "min" in bounds else []
        parts += [f"{tag} ≤ {bounds['max']} {unit}".strip()] if "max" in bounds else []
    return "; ".join(parts) or "none"


def _targets(records: list[dict]) -> list[str]:
    known = [t for t in MEMBERS + PIPELINES if any(r.get("target") == t for r in records)]
    return known + [t for t in dict.fromkeys(r.get("target") for r in records) if t not in known]


def _sorted_best_first(records: list[dict], objective: str) -> list[dict]:
    sign = -1 if METRICS[objective].higher_is_better else 1
    return sorted(records, key=lambda r: (r.get(objective) is None, sign * (r.get(objective) or 0)))


def _status(record: dict, winner: dict | None, constraints: dict) -> str:
    if record is winner:
        return "★ best"
    broken = [tag for tag, bounds in constraints.items() if not satisfies(record, {tag: bounds})]
    return "✗ violates " + ", ".join(broken) if broken else "ok"


def _pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (throughput, p99) that no other point beats on both: scan by throughput descending, keep new p99 minima."""
    front, lowest_p99 = [], math.inf
    for throughput, p99 in sorted(points, key=lambda p: (-p[0], p[1])):
        if p99 < lowest_p99:
            front.append((throughput, p99))
            lowest_p99 = p99
    return sorted(front)


def _plot_pareto(path: Path, target: str, records: list[dict], winner: dict | None) -> None:
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
        ax.plot(*zip(*_pareto_front(points), strict=True), color="tab:orange", marker="o", label="Pareto front")
    else:
        ax.text(0.5, 0.5, "no measured points", ha="center", va="center", transform=ax.transAxes)
    if winner is not None and winner.get("throughput_rps") is not None and winner.get("latency_p99_ms") is not None:
        ax.scatter([winner["throughput_rps"]], [winner["latency_p99_ms"]], s=200, marker="*", color="tab:red", zorder=3, label="best")
    ax.set(title=f"{target}: throughput vs p99 latency", xlabel=_header("throughput_rps"), ylabel=_header("latency_p99_ms"))
    if points:
        ax.legend()
    fig.savefig(path, dpi=100)


def _plot_by_param(path: Path, param: str, records: list[dict], targets: list[str]) -> None:
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
    ax.set_xticks(range(len(labels)), [_cell(values[k]) for k in labels])
    ax.set(title=f"best throughput by {param}", xlabel=param, ylabel=_header("throughput_rps"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.savefig(path, dpi=100)


def _safe_name(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", str(name))


def _time_outside(records: list[dict], targets: list[str]) -> str:
    rows = []
    for target in targets:
        seconds = [
            (r.get("reconfigure_s") or 0) + (r.get("warmup_s") or 0)
            for r in records
            if r.get("target") == target and (r.get("reconfigure_s") is not None or r.get("warmup_s") is not None)
        ]
        if seconds:
            summary = {"min_s": min(seconds), "median_s": statistics.median(seconds), "max_s": max(seconds), "total_s": sum(seconds)}
            rows.append({"target": target, "points": len(seconds), **summary})
    if not rows:
        return "No reconfigure or warm-up times were recorded."
    return render_table(rows, list(rows[0]))


def _table_section(heading: str, rows: list[dict], explanation: str) -> list[str]:
    """Report lines for one computed table: heading, table, what it means; nothing when there are no rows."""
    return ["", heading, "", render_table(rows, list(rows[0])), "", explanation] if rows else []


def write_report(
    out_dir: Path,
    suite_name: str,
    records: list[dict],
    swept: list[str],
    constraints: dict,
    objective: str,
    bare: list[dict],
    environment: dict,
) -> Path:
    """report.md with tables, flags and links to PNG plots in out_dir/plots/; returns the report's path."""
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    targets = _targets(records)
    params = [p for p in dict.fromkeys(swept) if p != "target"]
    winners = {t: best([r for r in records if r.get("target") == t], constraints, objective) for t in targets}
    env_rows = [{"key": k, "value": json.dumps(v) if isinstance(v, dict | list) else v} for k, v in environment.items()]
    md = [
        f"# Benchmark report: {suite_name}",
        "",
        "## Environment",
        "",
        render_table(env_rows, ["key", "value"]),
        "",
        f"**Objective:** {objective} ({METRICS[objective].unit}, {_direction(objective)})  ",
        f"**Constraints:** {_constraint_text(constraints)}",
        "",
        "## Best configuration",
        "",
    ]
    for target in targets:
        winner = winners[target]
        if winner is None:
            md.append(f"- **{target}**: no point satisfied the constraints.")
        else:
            settings = ", ".join(f"{p}={_cell(winner.get(p))}" for p in params)
            metrics = ", ".join(f"{_header(m)} {_cell(winner.get(m))}" for m in ("throughput_rps", "latency_p99_ms"))
            md.append(f"- **{target}**: `{winner.get('run_id')}` ({settings}): {metrics}")

    md += _table_section(
        "## Served model vs bare model",
        served_vs_bare(records, constraints, objective, bare),
        "The best `seg` point (first row), then the best batch size for each other thread count, against the network's "
        "in-process forward throughput at the same batch size, thread count and input size: `bare_beside_rps` measured right "
        "after the point (the ratio uses it), `bare_end_rps` at the end of the suite (`bare.json`: median of interleaved "
        "slices, with their range). What TorchServe, decoding and batching cost on top of the compute.",
    )
    md += _table_section(
        "## Pipeline efficiency",
        efficiency(records, constraints, objective, bare),
        "Each rate is the best point of its target under the constraints. The *shared* bound assumes both members run on "
        "the same CPUs, so every request costs 1/seg_rps + 1/jpeg_rps seconds of the machine: 1/(1/seg_rps + 1/jpeg_rps). The "
        "*disjoint* bound assumes each member has its own resources, so the slower one sets the pace: min(seg_rps, jpeg_rps). A "
        "ratio near 1 means the pipeline loses little to the serving glue between its steps; ratio_bare compares it with the "
        "bare model's in-process forward throughput at the same batch size and threads, the compute limit.",
    )
    md += _table_section(
        "### Where a pipeline request's time goes (best point of each pipeline)",
        time_breakdown(records, constraints, objective),
        "node_ms is TorchServe's own per-request mean (Prometheus `ts_inference_latency_microseconds`, per node): from "
        "the job's creation in the frontend to its response, so it holds the queue wait (`of_which_queue_ms`), the "
        "batch's wait for its slowest member and the worker round trip. handler_ms_per_request is the handler's decode + "
        "predict + encode time divided by the requests it served. The last row of each pipeline is the client's mean "
        "latency minus the nodes' time: the frontend's hops (HTTP, and for a workflow its per-request thread pool and "
        "the bytes between nodes) and the loopback network; a few ms below zero means none (the server's means also "
        "cover the warm-up). cpu_pct: that process's CPU use (% of one core).",
    )

    columns = ["status", "run_id", *params, *(_header(m) for m in TABLE_METRICS)]
    for target in targets:
        group = [r for r in records if r.get("target") == target]
        measured, failed = [r for r in group if not r.get("error")], [r for r in group if r.get("error")]
        plot = f"throughput_vs_p99_{_safe_name(target)}.png"
        _plot_pareto(plots_dir / plot, target, measured, winners[target])
        table = [
            {
                "status": _status(r, winners[target], constraints),
                **{p: r.get(p) for p in ["run_id", *params]},
                **{_header(m): r.get(m) for m in TABLE_METRICS},
            }
            for r in _sorted_best_first(measured, objective)
        ]
        md += [
            "",
            f"## {target}",
            "",
            f"Sorted best first by {objective}.",
            "",
            render_table(table, columns),
            "",
            f"![{target}: throughput vs p99](plots/{plot})",
        ]
        if failed:
            md += ["", "Failed points:", "", *(f"- `{r.get('run_id')}`: {_cell(r['error'])}" for r in failed)]

    if params:
        md += ["", "## Throughput by parameter", ""]
    for param in params:
        plot = f"throughput_by_{_safe_name(param)}.png"
        _plot_by_param(plots_dir / plot, param, records, targets)
        md += [f"![throughput by {param}](plots/{plot})", ""]

    unstable = [f"`{r.get('run_id')}`" for r in records if r.get("stable") is False]
    saturated = [f"`{r.get('run_id')}`" for r in records if r.get("client_saturated") is True]
    md += [
        "",
        "## Flags",
        "",
        f"- Measurement not stable: {', '.join(unstable) or 'none'}",
        f"- Load generator saturated (its numbers understate the server): {', '.join(saturated) or 'none'}",
        "",
        "## Time outside measurement (reconfigure_s + warmup_s)",
        "",
        _time_outside(records, targets),
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(md))
    return path


def _change(old: float, new: float) -> float:
    if old == 0:
        return 0.0 if new == 0 else math.copysign(math.inf, new)
    return (new - old) / abs(old)


def compare(
    old_dir: Path, new_dir: Path, tolerance: float = 0.05, metrics: tuple[str, ...] = ("throughput_rps", "latency_p99_ms")
) -> tuple[str, bool]:
    """Join two result folders on run_id; a metric regresses when it gets worse by more than `tolerance` (relative)."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"{unknown}: not metrics; choose from {sorted(METRICS)}")
    old = {r["run_id"]: r for r in read_summary(old_dir)}
    new = {r["run_id"]: r for r in read_summary(new_dir)}
    lines, regressed = [], False
    for run_id in [i for i in old if i in new]:
        before, after = old[run_id], new[run_id]
        parts = []
        if after.get("error") and not before.get("error"):
            # a point that used to work and now fails is the worst regression there is
            regressed = True
            parts.append(f"now failing: {after['error']} REGRESSED")
        for tag in metrics:
            a, b = before.get(tag), after.get(tag)
            if a is None or b is None:
                parts.append(f"{tag} {_cell(a)} → {_cell(b)}")
                continue
            change = _change(a, b)
            worse = -change if METRICS[tag].higher_is_better else change
            mark = " REGRESSED" if worse > tolerance else ""
            regressed = regressed or bool(mark)
            parts.append(f"{tag} {_cell(a)} → {_cell(b)} ({change:+.1%}){mark}")
        lines.append(f"{run_id}: " + "; ".join(parts))
    lines += [f"{run_id}: only in old ({old_dir})" for run_id in old if run_id not in new]
    lines += [f"{run_id}: only in new ({new_dir})" for run_id in new if run_id not in old]
    return "\n".join(lines), regressed
