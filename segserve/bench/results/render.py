"""Records and analyses as text: Markdown tables (floats rounded, None → –), metric headers with units, and
the terminal summary a run ends with. Reads records and an Analysis; measures nothing."""

import math

from segserve.bench.results.analysis import Analysis
from segserve.bench.results.engines import engine_verdict
from segserve.bench.suite.columns import METRICS, satisfies
from segserve.shown_text import for_markdown, for_terminal

UNIT_SUFFIXES = ("_rps", "_ms", "_pct", "_mb", "_s")


def cell(value) -> str:
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
    # text may come from outside (an answer's body, a worker's exception): literal, on its line, in its cell
    return for_markdown(value)


def render_table(records: list[dict], columns: list[str] | None = None) -> str:
    """A Markdown table; floats rounded for reading, None → '–', or for a ratio withheld as uncertain its
    `<column>_uncertain` text. Columns: given, or every key in first-seen order (the notes shown in place)."""
    columns = columns or [k for k in dict.fromkeys(key for record in records for key in record) if not k.endswith("_uncertain")]

    def shown(record: dict, column: str):
        value = record.get(column)
        return record.get(f"{column}_uncertain") if value is None and record.get(f"{column}_uncertain") else value

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(shown(r, c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def header(tag: str) -> str:
    """'latency_p99_ms' → 'latency p99 (ms)': the unit from METRICS instead of the name's suffix."""
    if tag not in METRICS:
        return tag
    name = next((tag.removesuffix(s) for s in UNIT_SUFFIXES if tag.endswith(s)), tag)
    unit = METRICS[tag].unit
    return name.replace("_", " ") if unit in name else f"{name.replace('_', ' ')} ({unit})"


def direction(tag: str) -> str:
    return "higher is better" if METRICS[tag].higher_is_better else "lower is better"


def constraint_text(constraints: dict) -> str:
    parts = []
    for tag, bounds in constraints.items():
        unit = METRICS[tag].unit if tag in METRICS else ""
        parts += [f"{tag} ≥ {bounds['min']} {unit}".strip()] if "min" in bounds else []
        parts += [f"{tag} ≤ {bounds['max']} {unit}".strip()] if "max" in bounds else []
    return "; ".join(parts) or "none"


def sorted_best_first(records: list[dict], objective: str) -> list[dict]:
    sign = -1 if METRICS[objective].higher_is_better else 1
    return sorted(records, key=lambda r: (r.get(objective) is None, sign * (r.get(objective) or 0)))


def status(record: dict, winner: dict | None, constraints: dict) -> str:
    if record is winner:
        return "★ best"
    if record.get("valid") is False and not record.get("error"):
        return "✗ invalid (accuracy)"
    if record.get("stalled"):  # never feasible (columns.satisfies), whatever its constraints say
        return f"✗ stalled {record.get('stalled_s') or 0:.0f} s"
    broken = [tag for tag, bounds in constraints.items() if not satisfies(record, {tag: bounds})]
    return "✗ violates " + ", ".join(broken) if broken else "ok"


def terminal_summary(records: list[dict], swept: list[str], analysis: Analysis) -> str:
    """What a user sees at the end of a run: every point in one table, then the analyses."""
    columns = ["run_id", *[p for p in swept if p != "target"], "throughput_rps", "latency_p50_ms", "latency_p99_ms"]
    columns += ["requests_failed", "server_queue_ms", "reconfigure_s", "error"]
    text = "\n" + render_table(records, columns)
    for record in records:
        if record.get("disturbed"):
            text += (
                f"\n{record['run_id']}: DISTURBED — other processes took up to {cell(record.get('others_cpu_pct'))}% of the machine "
                f"and {record.get('windows_discarded')} window(s) were discarded; its numbers are not the server's alone"
            )
        if record.get("bare_disturbed"):
            text += (
                f"\n{record['run_id']}: bare forward DISTURBED — other processes took up to {cell(record.get('bare_others_cpu_pct'))}% "
                "of the machine in too many of its slices; its served ÷ bare ratio is not printed as a number"
            )
    if analysis.engines:
        columns = ["target", "point", "torchserve_rps", "ray_rps", "ray_vs_torchserve", "ci_low", "ci_high", "ray_vs_torchserve_cpu"]
        text += f"\n\nEngines: {engine_verdict(analysis.engines)}\n" + render_table(analysis.engines, columns)
    if analysis.served_vs_bare:
        text += "\n\nServed vs bare forward (best batch size per thread count):\n" + render_table(analysis.served_vs_bare)
    rows = analysis.efficiency
    if rows:
        text += "\n\nPipeline efficiency (best point of each target):\n"
        text += render_table(rows, ["pipeline", "pipeline_rps", "members", "shared_bound_rps", "ratio_shared"])
        text += "\n\n" + render_table(
            rows, ["pipeline", "disjoint_bound_rps", "ratio_disjoint", "bare_rps", "ratio_bare", "bare_batch_size"]
        )
        # a row from a point that stalled, lost answers or broke a constraint: said beside it, not left out
        flagged = [row for row in rows if row.get("flags")]
        text += "".join(
            f"\n{row['pipeline']}: {'' if row['feasible'] else 'NOT FEASIBLE: '}{for_terminal(row['flags'])}" for row in flagged
        )
    if analysis.breakdown:
        text += "\n\nWhere a pipeline request's time goes (ms per request; node_ms holds the queue; see report.md):\n"
        text += render_table(analysis.breakdown)
    return text
