"""The point that stands for a target in the efficiency table, and what is wrong with it.

A target's best point is the best that meets the constraints (columns.best). A workflow whose every point stalled
or lost answers has none, yet it served requests: leaving its row out hides what it lost. So the table shows its
best served point instead, flagged with why it is not feasible (stalled, lost answers, failed requests, a
constraint broken, disturbed), and a target without a best point is said why in words that fit: "no point met the
constraints" only where there are constraints.
"""

from segserve.bench.suite.columns import METRICS, satisfies


class Shown:
    """Per target: the point the efficiency table shows (its best, else its best served point) and its flags."""

    def __init__(self, records: list[dict], winners: dict[str, dict | None], constraints: dict, objective: str):
        self.records, self.winners, self.constraints, self.objective = records, winners, constraints, objective

    def ran(self) -> set:
        return {r.get("target") for r in self.records}

    def point(self, target: str) -> dict | None:
        """The target's best point, else its best point that answered requests (any flag), else None."""
        if self.winners.get(target):
            return self.winners[target]
        served = [r for r in self.records if r.get("target") == target and not r.get("error") and r.get("throughput_rps")]
        sign = -1 if METRICS[self.objective].higher_is_better else 1
        return min(served, key=lambda r: (r.get(self.objective) is None, sign * (r.get(self.objective) or 0)), default=None)

    def flags(self, target: str) -> list[str]:
        """What is wrong with the shown point: why it is not feasible, and what it lost or failed."""
        point = self.point(target)
        return point_flags(point, self.constraints) if point else []

    def reason(self, target: str) -> str:
        return no_winner_reason(self.records, target, self.constraints)


def point_flags(point: dict, constraints: dict) -> list[str]:
    """A served point's trouble, in words: stalled (and why), answers lost (and why), requests failed, an accuracy
    gate failed, constraints broken (only where there are constraints), disturbed."""
    flags = []
    if point.get("stalled"):
        flags.append(point.get("stall_cause") or f"stalled {point.get('stalled_s') or 0:.0f} s")
    if point.get("lost_cause") and not point.get("stalled"):  # a stall's cause already says what was lost
        flags.append(point["lost_cause"])
    if point.get("requests_failed"):
        by_status = ", ".join(f"{status}: {count}" for status, count in (point.get("failures_by_status") or {}).items())
        flags.append(f"{point['requests_failed']} request(s) failed" + (f" ({by_status})" if by_status else ""))
    if point.get("valid") is False:
        flags.append(f"invalid: {point.get('invalid_reason')}")
    broken = [tag for tag, bounds in constraints.items() if not satisfies({**point, "stalled": False, "valid": True}, {tag: bounds})]
    if broken:
        flags.append(f"violates {', '.join(broken)}")
    if point.get("disturbed"):
        flags.append(f"disturbed (others took {point.get('others_cpu_pct') or 0:.0f}% of the machine)")
    return flags


def no_winner_reason(records: list[dict], target: str, constraints: dict) -> str:
    """Why a target has no best point: not measured; its points' errors where every one failed; else what kept each
    from it (stalled, invalid, failed, and "no point met the constraints" only where there are constraints)."""
    points = [r for r in records if r.get("target") == target]
    if not points:
        return "not measured"
    errors = list(dict.fromkeys(r["error"] for r in points if r.get("error")))
    if len(errors) and all(r.get("error") for r in points):
        return "; ".join(errors)
    measured = [r for r in points if not r.get("error")]
    counted = {
        "stalled": [r for r in measured if r.get("stalled")],
        "failed the accuracy gate": [r for r in measured if r.get("valid") is False],
        "answered nothing": [r for r in measured if r.get("throughput_rps") is None],
    }
    said = [f"{len(rows)} of {len(points)} point(s) {what}" for what, rows in counted.items() if rows]
    if counted["stalled"]:
        worst = max(counted["stalled"], key=lambda r: r.get("stalled_s") or 0)
        said[0] += f" (`{worst.get('run_id')}`: {worst.get('stall_cause') or 'stalled'})"
    if errors:
        said.append(f"{len(points) - len(measured)} failed: {'; '.join(errors)}")
    if constraints and any(not satisfies({**r, "stalled": False, "valid": True}, constraints) for r in measured):
        said.append("no point met the constraints")
    disturbed = sum(bool(r.get("disturbed")) for r in measured)
    if disturbed:
        said.append(f"{disturbed} disturbed")
    return "; ".join(said) or "no point was measured with a rate"


def efficiency_notes(shown: Shown, pipelines: dict) -> list[str]:
    """Why a pipeline measured with its members has no efficiency row (which target answered no request, and why),
    and which member was measured without inputs that a node above it failed (it never gets them in the workflow
    either)."""
    notes, ran = [], shown.ran()
    for name, pipeline in pipelines.items():
        if name not in ran or not ran & set(pipeline.members):
            continue  # a pipeline measured without its members has no bounds to miss
        missing = [target for target in (name, *pipeline.members) if shown.point(target) is None]
        why = [f"{target}: {shown.reason(target)}" for target in missing]
        if why:
            notes.append(f"{name} has no row: {'; '.join(why)}")
        notes += [
            f"{member} was measured without the inputs a node above it failed: {point['inputs_left_out']}"
            for member in pipeline.members
            if (point := shown.point(member) or {}).get("inputs_left_out")
        ]
    return notes
