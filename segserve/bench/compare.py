"""`segserve bench compare OLD NEW`: join two result folders on run id and flag what got worse.

Points measured differently (other load settings, inputs, archive recipe or server config) have other run
ids; when such a pair shares a place in the space (point_key) the comparison is refused, saying what differs.
"""

import math
from pathlib import Path

from segserve.bench.render import cell
from segserve.bench.results import read_summary
from segserve.bench.schema import METRICS
from segserve.errors import UsageError


def measured_differently(old: list[dict], new: list[dict]) -> list[str]:
    """One line per point that both folders hold with another setup, naming the parts that differ."""
    old_by_key = {r["point_key"]: r for r in old if r.get("point_key")}
    lines = []
    for after in new:
        before = old_by_key.get(after.get("point_key"))
        if before is None or before["run_id"] == after["run_id"]:
            continue
        parts = sorted(
            k
            for k in set(before.get("setup") or {}) | set(after.get("setup") or {})
            if (before.get("setup") or {}).get(k) != (after.get("setup") or {}).get(k)
        )
        lines.append(f"{after['target']} {before['run_id']} vs {after['run_id']}: measured with other {', '.join(parts) or 'settings'}")
    return lines


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
    old_rows, new_rows = read_summary(old_dir), read_summary(new_dir)
    differently = measured_differently(old_rows, new_rows)
    if differently:
        raise UsageError("\n".join(["cannot compare: points were measured differently", *differently]))
    old = {r["run_id"]: r for r in old_rows}
    new = {r["run_id"]: r for r in new_rows}
    if old and new and not set(old) & set(new):
        raise UsageError(
            f"{old_dir} and {new_dir} have no point in common (other suites, or run ids from before 3851533, which "
            "changed their form): nothing to compare"
        )
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
                parts.append(f"{tag} {cell(a)} → {cell(b)}")
                continue
            change = _change(a, b)
            worse = -change if METRICS[tag].higher_is_better else change
            mark = " REGRESSED" if worse > tolerance else ""
            regressed = regressed or bool(mark)
            parts.append(f"{tag} {cell(a)} → {cell(b)} ({change:+.1%}){mark}")
        lines.append(f"{run_id}: " + "; ".join(parts))
    lines += [f"{run_id}: only in old ({old_dir})" for run_id in old if run_id not in new]
    lines += [f"{run_id}: only in new ({new_dir})" for run_id in new if run_id not in old]
    return "\n".join(lines), regressed
