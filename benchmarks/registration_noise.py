"""Where a gate's noise comes from (docs/benchmarking.md, "Numbers you can trust"): each target of the gate suite at 16
connections is registered REGISTRATIONS times (other targets in between) and measured 3 times per registration
(0.3 s warm-up, 3 windows of 0.6 s). Prints, per target and window rule (fixed edges, edges on completions):
the spread of windows within a measurement, of measurements within a registration, and of registrations.

    .venv/bin/python benchmarks/registration_noise.py [REGISTRATIONS=4]    # about 3 minutes on 2 cores
"""

import sys
from pathlib import Path

import numpy as np

from segserve.archives.catalog import Catalog
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.load import LoadSpec, run_load
from segserve.bench.run.suite_inputs import SuiteInputs
from segserve.bench.suite import plan as planning
from segserve.bench.suite.spec import load_suite

WINDOW_S, WARMUP_S, WINDOWS, MEASUREMENTS = 0.6, 0.3, 3, 3


def rates(result, on_completions: bool) -> list[float]:
    spans = [(WARMUP_S + k * WINDOW_S, WARMUP_S + (k + 1) * WINDOW_S) for k in range(WINDOWS)]
    if on_completions:
        return [result.rate_rps(a, b) for a, b in spans]
    return [sum(result.window(a, b).ok) / WINDOW_S for a, b in spans]


def cv(values) -> float:
    return float(np.std(values, ddof=1) / np.mean(values))


def main(registrations: int) -> None:
    root = Path.cwd()
    catalog = Catalog(root)
    suite = load_suite(root / "benchmarks" / "gate.yaml", catalog)
    weights = root / "weights" / "seg.pt"
    setup = SuiteInputs(suite, catalog, weights)
    points = [p for p in planning.expand(suite, catalog, setup.digests()) if p.params.get("concurrency") == 16]
    deployment = Deployment(suite, catalog, weights, lambda _: None)
    results: dict[str, list] = {}
    try:
        for _ in range(registrations):
            for point in points:  # another target in between: every registration is a fresh one
                endpoint = deployment.deploy(point)
                spec = LoadSpec(endpoint.url, endpoint.path, setup.bodies_for(point.target), endpoint.token, 16)
                measured = [run_load(spec, WARMUP_S + WINDOWS * WINDOW_S + 0.05) for _ in range(MEASUREMENTS)]
                results.setdefault(point.target, []).append(measured)
    finally:
        deployment.close()
    print(f"{'target':16s} {'windows':8s} {'window cv':>10s} {'within reg':>11s} {'between regs':>13s} {'req/s':>7s}")
    for target, by_registration in results.items():
        for on_completions, name in ((False, "fixed"), (True, "on done")):
            windows = [rates(r, on_completions) for reg in by_registration for r in reg]
            means = np.array([[np.mean(rates(r, on_completions)) for r in reg] for reg in by_registration])
            within = np.mean([cv(row) for row in means])
            print(
                f"{target:16s} {name:8s} {np.mean([cv(w) for w in windows]):10.3f} {within:11.3f} "
                f"{cv(means.mean(axis=1)):13.3f} {means.mean():7.1f}"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
