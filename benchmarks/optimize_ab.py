"""Optimisations side by side (docs/optimisation.md): for each TARGET:A:B, the suite's point of
that target with optimize=A and with optimize=B (in segserve's own venv), each registered afresh and measured in
turn, A B / B A, for ROUNDS rounds on one TorchServe. Prints each round and B ÷ A with its 95% interval (t over
the rounds' ratios, as `bench ab` pairs them): a ratio measured in one run, not two numbers from different hours.

    .venv/bin/python benchmarks/optimize_ab.py benchmarks/optimize.yaml 3 seg_jpeg_fused:eager:int8 seg_jpeg:eager:int8
"""

import json
import sys
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.results.compare import paired_change
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.runner import Runner
from segserve.bench.run.suite_inputs import SuiteInputs
from segserve.bench.search import GridSearch
from segserve.bench.suite import plan as planning
from segserve.bench.suite.spec import load_suite


def point_of(points, target: str, optimize: str):
    found = [p for p in points if p.target == target and p.params.get("optimize") == optimize and p.params.get("venv") in (None, ".venv")]
    if len(found) != 1:
        raise SystemExit(f"{target} optimize={optimize}: {len(found)} point(s) in the suite (expected one)")
    return found[0]


def main(suite_path: Path, rounds: int, pairs: list[str]) -> None:
    root = Path.cwd()
    catalog = Catalog(root)
    suite = load_suite(suite_path, catalog)
    weights = root / "weights" / "seg.pt"
    setup = SuiteInputs(suite, catalog, weights)
    points = planning.expand(suite, catalog, setup.digests())
    chosen = {pair: [point_of(points, pair.split(":")[0], side) for side in pair.split(":")[1:]] for pair in pairs}
    deployment = Deployment(suite, catalog, weights, lambda _: None)
    runner = Runner(catalog, deployment, GridSearch([]), [], setup.bodies_for, lambda _: None)
    measured = {pair: ([], []) for pair in pairs}
    try:
        for round_index in range(rounds):
            for pair, sides in chosen.items():
                order = (0, 1) if round_index % 2 == 0 else (1, 0)
                for side in order:
                    deployment.release()  # fresh workers every round, on both sides
                    record = runner.measure_point(sides[side])
                    if record["error"]:
                        raise SystemExit(f"{pair} side {side}: {record['error']}")
                    measured[pair][side].append(record["throughput_rps"])
                a, b = measured[pair]
                print(f"round {round_index + 1} {pair}: A {a[-1]:.1f} req/s, B {b[-1]:.1f} req/s", flush=True)
    finally:
        deployment.close()
    summary = {}
    for pair, (a, b) in measured.items():
        change = paired_change(a, b, 0.05)
        low, high = (1 + change.low, 1 + change.high) if change.low is not None else (float("nan"), float("nan"))
        print(f"{pair}: B ÷ A = {1 + change.change:.2f} (95% interval {low:.2f} … {high:.2f}); A {a}, B {b}")
        summary[pair] = {"a_rps": a, "b_rps": b, "ratio": 1 + change.change, "low": low, "high": high}
    print(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
