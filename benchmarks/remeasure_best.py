"""Re-measure the best point of two runs of the same suite side by side (docs/search.md): the best candidate
(under the suite's constraints) of result folder A and of B, each registered afresh and measured in turn, A B,
B A, … for ROUNDS rounds on one TorchServe. Prints each round's throughput and B ÷ A − 1 with its 95% interval
(t over the rounds, as `bench ab` pairs them).

    .venv/bin/python benchmarks/remeasure_best.py RESULTS_A RESULTS_B [ROUNDS=4]   # about 2 minutes on 2 cores
"""

import json
import sys
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.results.compare import paired_change
from segserve.bench.results.store import read_summary
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.runner import Runner
from segserve.bench.run.suite_inputs import SuiteInputs
from segserve.bench.run.suite_run import members_of
from segserve.bench.search import GridSearch, candidates
from segserve.bench.suite import plan as planning
from segserve.bench.suite.columns import best
from segserve.bench.suite.spec import load_suite


def best_row(folder: Path, suite, catalog, points) -> dict:
    keys = {p.key for p in candidates(points, members_of(suite, catalog))}
    rows = [r for r in read_summary(folder) if r.get("point_key") in keys]
    constraints = {k: v.model_dump(exclude_none=True) for k, v in suite.constraints.items()}
    return best(rows, constraints, suite.objective)


def main(folder_a: Path, folder_b: Path, rounds: int) -> None:
    root = Path.cwd()
    catalog = Catalog(root)
    suite = load_suite(folder_a / "suite.yaml", catalog)
    weights = root / "weights" / "seg.pt"
    setup = SuiteInputs(suite, catalog, weights)
    points = planning.expand(suite, catalog, setup.digests())
    by_key = {p.key: p for p in points}
    chosen = {}
    for name, folder in (("A", folder_a), ("B", folder_b)):
        row = best_row(folder, suite, catalog, points)
        chosen[name] = by_key[row["point_key"]]
        params = " ".join(f"{k}={v}" for k, v in chosen[name].params.items())
        print(f"{name}: {folder} best {row['throughput_rps']:.1f} req/s when searched: {chosen[name].target} {params}")
    deployment = Deployment(suite, catalog, weights, lambda _: None)
    runner = Runner(catalog, deployment, GridSearch([]), [], setup.bodies_for, lambda _: None)
    measured: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for round_index in range(rounds):
            order = ("A", "B") if round_index % 2 == 0 else ("B", "A")
            for name in order:
                deployment.release()  # fresh workers every round, on both sides
                record = runner.measure_point(chosen[name])
                if record["error"]:
                    raise SystemExit(f"{name}: {record['error']}")
                measured[name].append(record["throughput_rps"])
            print(f"round {round_index + 1}: A {measured['A'][-1]:.1f} req/s, B {measured['B'][-1]:.1f} req/s")
    finally:
        deployment.close()
    change = paired_change(measured["A"], measured["B"], 0.05)
    low, high = change.low if change.low is not None else float("nan"), change.high if change.high is not None else float("nan")
    print(f"B ÷ A − 1 = {change.change:+.1%} (95% interval {low:+.1%} … {high:+.1%}): {change.verdict}")
    print(json.dumps({"a_rps": measured["A"], "b_rps": measured["B"], "change": change.change, "low": change.low, "high": change.high}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4)
