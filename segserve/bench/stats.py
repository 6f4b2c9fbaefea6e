"""Numbers from recorded latencies: percentiles and the stability rule for measurement windows."""

import numpy as np


def latency_summary(latencies_ms: list[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 and max of successful requests (linear interpolation between samples)."""
    if not latencies_ms:
        return dict.fromkeys(("latency_mean_ms", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_max_ms"))
    values = np.asarray(latencies_ms, dtype=float)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "latency_mean_ms": float(values.mean()),
        "latency_p50_ms": float(p50),
        "latency_p90_ms": float(p90),
        "latency_p99_ms": float(p99),
        "latency_max_ms": float(values.max()),
    }


def spread(values: list[float]) -> float:
    """(max - min) / mean; infinite when the mean is 0 (nothing was served)."""
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean > 0 else float("inf")


def stable_tail(window_throughputs: list[float], count: int, tolerance: float) -> bool:
    """True when the last `count` windows agree within `tolerance` (relative spread)."""
    return len(window_throughputs) >= count and spread(window_throughputs[-count:]) <= tolerance


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator
