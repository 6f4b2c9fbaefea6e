"""Engines side by side (grid.server.engine): each point measured on both TorchServe and Ray with every other value
the same, Ray ÷ TorchServe in throughput (the ratio of the medians of its rounds', or else of its windows', with a
bootstrap interval) and in server CPU per request, and which engine was faster where the interval says so.

A record without `engine` ran on TorchServe (before the Ray engine there was no other)."""

import statistics

from segserve.bench.results.stats import ratio_of_medians

ENGINES = ("torchserve", "ray")
# what identifies a point besides its engine: its target and parameters (bench/run/point.py record_for's keys)
IDENTITY_EXCLUDED = {"engine", "run_id", "point_key"}


def engine_of(record: dict) -> str:
    return record.get("engine") or "torchserve"


def _samples(record: dict) -> list[float]:
    """A point's throughput samples: its rounds' (bench --rounds), else its measured windows'."""
    return record.get("rounds_throughput_rps") or record.get("measured_window_throughputs_rps") or []


def engine_pairs(records: list[dict], params: list[str]) -> list[tuple[dict, dict]]:
    """(TorchServe's record, Ray's record) of each point measured on both, every swept value but the engine equal."""
    by_point: dict[tuple, dict[str, dict]] = {}
    for record in records:
        if record.get("error") or record.get("throughput_rps") is None:
            continue
        key = (record.get("target"), *((p, repr(record.get(p))) for p in params if p not in IDENTITY_EXCLUDED))
        by_point.setdefault(key, {})[engine_of(record)] = record
    return [(engines["torchserve"], engines["ray"]) for engines in by_point.values() if set(ENGINES) <= set(engines)]


def engine_rows(records: list[dict], params: list[str]) -> list[dict]:
    """One row per point measured on both engines: Ray ÷ TorchServe in throughput (interval) and CPU per request."""
    rows = []
    for torchserve, ray in engine_pairs(records, params):
        value, interval = ratio_of_medians(_samples(ray), _samples(torchserve))
        cpu_ts, cpu_ray = torchserve.get("server_cpu_ms_per_request"), ray.get("server_cpu_ms_per_request")
        shown = {p: ray.get(p) for p in params if p not in IDENTITY_EXCLUDED and ray.get(p) is not None}
        rows.append(
            {
                "target": ray.get("target"),
                "point": ", ".join(f"{k}={v}" for k, v in shown.items()),
                "torchserve_rps": torchserve["throughput_rps"],
                "ray_rps": ray["throughput_rps"],
                "ray_vs_torchserve": value,
                "ci_low": interval[0] if interval else None,
                "ci_high": interval[1] if interval else None,
                "torchserve_cpu_ms_per_request": cpu_ts,
                "ray_cpu_ms_per_request": cpu_ray,
                "ray_vs_torchserve_cpu": cpu_ray / cpu_ts if cpu_ts and cpu_ray else None,
                "faster": faster(interval),
            }
        )
    return rows


def faster(interval: tuple[float, float] | None) -> str:
    """Which engine the interval of Ray ÷ TorchServe says is faster: "ray" above 1, "torchserve" below, else "neither"
    (an interval that holds 1, or none: a single window)."""
    if not interval:
        return "neither"
    low, high = interval
    return "ray" if low > 1 else "torchserve" if high < 1 else "neither"


def engine_verdict(rows: list[dict]) -> str | None:
    """The sentence report.md opens the comparison with: which engine was faster, on how many points."""
    if not rows:
        return None
    counts = {name: sum(row["faster"] == name for row in rows) for name in (*ENGINES, "neither")}
    ratios = [row["ray_vs_torchserve"] for row in rows if row["ray_vs_torchserve"] is not None]
    median = f"; Ray ÷ TorchServe throughput, median of the points: {statistics.median(ratios):.2f}" if ratios else ""
    leader = max(ENGINES, key=lambda name: counts[name])
    if counts[leader] == 0 or counts["ray"] == counts["torchserve"]:
        return (
            f"Faster: neither engine on more of the {len(rows)} point(s) (ray {counts['ray']}, torchserve {counts['torchserve']}){median}."
        )
    return (
        f"Faster: **{leader}** on {counts[leader]} of {len(rows)} point(s) (ray {counts['ray']}, torchserve {counts['torchserve']}, "
        f"neither {counts['neither']}){median}."
    )
