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


def mean_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """Student's t interval of the mean of `values` (a point's window throughputs); None with fewer than two."""
    if len(values) < 2:
        return None
    from scipy import stats  # imported here: only measuring needs it

    sample = np.asarray(values, dtype=float)
    if np.ptp(sample) == 0:
        return float(sample[0]), float(sample[0])
    low, high = stats.t.interval(confidence, len(sample) - 1, loc=sample.mean(), scale=stats.sem(sample))
    return float(low), float(high)


def bootstrap_interval(
    samples: list[list[float]], statistic, confidence: float = 0.95, resamples: int = 2000
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of statistic(*samples), each sample resampled on its own (scipy); None when a
    sample has fewer than two values. Seeded: the same records give the same interval."""
    if not samples or any(len(sample) < 2 for sample in samples):
        return None
    from scipy import stats

    arrays = tuple(np.asarray(sample, dtype=float) for sample in samples)
    result = stats.bootstrap(
        arrays, statistic, n_resamples=resamples, confidence_level=confidence, method="percentile", vectorized=False, rng=0
    )
    low, high = result.confidence_interval
    return float(low), float(high)


def ratio_of_medians(numerator: list[float], denominator: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """median(numerator) / median(denominator) and its bootstrap interval (served ÷ bare: windows over slices)."""
    if not numerator or not denominator or not np.median(denominator):
        return None, None

    def statistic(a, b):
        return np.median(a) / np.median(b)

    return float(statistic(numerator, denominator)), bootstrap_interval([numerator, denominator], statistic)


RATIO_TOLERANCE = 0.15  # a ratio is printed as a number only when its interval lies within ±15% of it


def uncertainty(value: float | None, interval: tuple[float, float] | None, reasons: list[str] = ()) -> str | None:
    """None when a measured ratio may be printed as a number: its 95% interval within ±RATIO_TOLERANCE of it and
    nothing disturbed it. Else what a table prints instead: "uncertain (low–high): why"."""
    if value is None:
        return None
    why = list(reasons)
    if interval is None:
        why.append("too few windows or slices for an interval")
    elif interval[0] < value * (1 - RATIO_TOLERANCE) or interval[1] > value * (1 + RATIO_TOLERANCE):
        why.append(f"its interval is wider than ±{RATIO_TOLERANCE:.0%}")
    if not why:
        return None
    span = f"{interval[0]:.2f}–{interval[1]:.2f}" if interval else f"{value:.2f}, no interval"
    return f"uncertain ({span}): {'; '.join(why)}"
