"""Points measured in rounds, written once: `bench --rounds` and `bench ab` (two sides, A and B) both drive their
measurements with `in_rounds`, and a point's rounds become one record with `combine_rounds`."""

import statistics
from collections import Counter

import numpy as np

from segserve.bench.results.stats import bootstrap_interval
from segserve.bench.run.baselines import ratio_judgement, served_vs_bare
from segserve.bench.run.failures import merged


def round_schedule(points: list, rounds: int, sides: tuple = (None,)):
    """(round, point, side) in the order they are measured: the points' order reversed every other round (A B C,
    C B A, …) so that no point always comes first or last, and with two sides (`bench ab`'s versions) each point's
    sides in turn, the other one first at each next point (a b, b a, …): a point's order flips between rounds too."""
    slot = 0  # the (round, point) pairs in measuring order: the first side alternates between them
    for index in range(rounds):
        for point in points if index % 2 == 0 else points[::-1]:
            for side in sides if slot % 2 == 0 else sides[::-1]:
                yield index, point, side
            slot += 1


def in_rounds(points: list, rounds: int, measure, release, sides: tuple = (None,), measured: dict | None = None) -> dict:
    """Every point on every side `rounds` times in round_schedule's order, `release()` between rounds (fresh
    workers: a registration's workers keep their luck, ±10% on 2 cores, which is then one round's noise).
    `measure(point, side)` → its record. Returns {(run_id, side): [each round's record]}; `measured`: that dict,
    given by a caller that reads what was measured when a round fails or is stopped part-way."""
    measured = {} if measured is None else measured
    this_round = 0  # the first round has the workers its caller started
    for index, point, side in round_schedule(points, rounds, sides):
        if index != this_round:
            release()
            this_round = index
        measured.setdefault((point.run_id, side), []).append(measure(point, side))
    return measured


def combine_rounds(rounds: list[dict]) -> dict:
    """One record of a point measured in rounds: throughput the median of the rounds' with a bootstrap interval
    of that median, p50/p99 the medians of the rounds', the windows and bare slices of every round pooled for the
    ratios (their intervals then hold the rounds' spread), flags set when any round's is; a failed round fails
    the point with its error."""
    failed = next((r for r in rounds if r.get("error")), None)
    rates = [r["throughput_rps"] for r in rounds if not r.get("error")]
    if failed is not None:
        return {**failed, "rounds": len(rounds), "rounds_throughput_rps": rates}
    record = dict(rounds[-1])
    interval = bootstrap_interval([rates], np.median)
    record.update(
        {
            "rounds": len(rounds),
            "rounds_throughput_rps": rates,
            "throughput_rps": statistics.median(rates),
            "throughput_ci_low_rps": interval[0] if interval else None,
            "throughput_ci_high_rps": interval[1] if interval else None,
            "rounds_latency_p99_ms": [r.get("latency_p99_ms") for r in rounds],
            "measured_window_throughputs_rps": [w for r in rounds for w in r.get("measured_window_throughputs_rps") or []],
            "requests_ok": sum(r.get("requests_ok") or 0 for r in rounds),
            "requests_failed": sum(r.get("requests_failed") or 0 for r in rounds),
            "failures": merged([r.get("failures") for r in rounds]),
        }
    )
    for key in ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_mean_ms"):
        values = [r[key] for r in rounds if r.get(key) is not None]
        record[key] = statistics.median(values) if values else None
    for flag in ("disturbed", "bare_disturbed", "suspect", "client_saturated", "stalled"):
        values = [r.get(flag) for r in rounds]  # None in every round: not watched (an http target), not clean
        record[flag] = None if all(v is None for v in values) else any(values)
    record["stable"] = all(r.get("stable") is not False for r in rounds)
    record["stalled_s"] = sum(r.get("stalled_s") or 0 for r in rounds)
    record["stall_cause"] = "; ".join(r["stall_cause"] for r in rounds if r.get("stall_cause")) or None
    if any(r.get("lost_answers") is not None for r in rounds):  # a workflow's: each round's added up by node
        record["lost_answers"] = dict(sum((Counter(r.get("lost_answers") or {}) for r in rounds), Counter()))
    record["lost_cause"] = "; ".join(dict.fromkeys(r["lost_cause"] for r in rounds if r.get("lost_cause"))) or None
    record["others_cpu_pct"] = max((r["others_cpu_pct"] for r in rounds if r.get("others_cpu_pct") is not None), default=None)
    if any(r.get("bare_slices_ips") for r in rounds):
        entries = [{"slices_ips": r.get("bare_slices_ips") or [], "disturbed": r.get("bare_disturbed")} for r in rounds]
        record.update(served_vs_bare(record["measured_window_throughputs_rps"], entries))
        record["bare_disturbed"] = any(r.get("bare_disturbed") for r in rounds)
        record["bare_slices_discarded"] = sum(r.get("bare_slices_discarded") or 0 for r in rounds)
        record["suspect"] = record["suspect"] or any(r.get("suspect") for r in rounds)
        record["bare_others_cpu_pct"] = max(
            (r["bare_others_cpu_pct"] for r in rounds if r.get("bare_others_cpu_pct") is not None), default=None
        )
        record.update(ratio_judgement(record))
    return record
