"""`segserve bench replay RESULTS --strategy grid,random,optuna,auto --budget 0.05,0.1,0.2 --seeds 20`: judge
search strategies without noise. Every point a strategy proposes is answered from a complete recorded grid
(no server), so two strategies see the same machine; the score of a run is the best point it found ÷ the
grid's best (objective and constraints of the recorded suite), over the candidate points (members served
alone are auto's probes, not candidates).
"""

import json
import statistics
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.results.render import render_table
from segserve.bench.results.store import read_summary
from segserve.bench.run.session import members_of
from segserve.bench.search import STRATEGIES, candidates, make_strategy
from segserve.bench.suite import plan as planning
from segserve.bench.suite.columns import METRICS, best
from segserve.bench.suite.spec import Budget, load_suite
from segserve.errors import UsageError


def parse_budget(text: str) -> Budget:
    """ "0.1": a fraction of the candidates; "15": a point count."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--budget {text!r}: give fractions of the grid (0.1) or point counts (15), comma-separated") from None
    if value <= 0 or (value > 1 and value != int(value)):
        raise UsageError(f"--budget {text!r}: a fraction in (0, 1] or a whole number of points")
    return Budget(fraction=value) if value <= 1 and "." in text else Budget(points=int(value))


def replay(result_dir: Path, catalog: Catalog, strategies: list[str], budgets: list[str], seeds: int, log=print) -> dict:
    """{strategy: {budget as given: {"median": x, "worst": y, "points": mean points used, "registrations": mean
    registrations (and restarts) the proposals would cause, in the order proposed}}}."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise UsageError(f"--strategy {unknown[0]!r}: one of {', '.join(STRATEGIES)}")
    suite = load_suite(Path(result_dir) / "suite.yaml", catalog)
    rows = {r.get("point_key"): r for r in read_summary(result_dir)}
    points = planning.expand(suite, catalog)
    missing = [p for p in points if p.key not in rows]
    if missing:
        example = " ".join(f"{k}={v}" for k, v in missing[0].params.items())
        raise UsageError(
            f"{result_dir}: {len(missing)} of the suite's {len(points)} points are not in its summary (e.g. {missing[0].target} "
            f"{example}): replay needs a complete grid, recorded with the same parameter declarations"
        )
    objective = suite.objective
    constraints = {k: v.model_dump(exclude_none=True) for k, v in suite.constraints.items()}
    members = members_of(suite, catalog)
    space = candidates(points, members)
    grid_best = best([rows[p.key] for p in space], constraints, objective)
    if grid_best is None:
        raise UsageError(f"{result_dir}: no candidate point meets the suite's constraints: nothing to find")
    higher = METRICS[objective].higher_is_better
    log(f"{len(space)} candidate points; grid best {objective} {grid_best[objective]:.4g} ({grid_best['run_id']})")
    results: dict[str, dict] = {}
    for name in strategies:
        for given in budgets:
            budget = parse_budget(given)
            scores, used, registrations, restarts = [], [], [], []
            for seed in range(seeds):
                search = suite.search  # the recorded suite's sampler and batch, if it has a search section
                strategy = make_strategy(name, points, budget, members, seed, [objective], constraints, search.sampler, batch=search.batch)
                told = []
                while (point := strategy.ask()) is not None:
                    record = rows[point.key]
                    strategy.tell(point, record)
                    told.append(point)
                found = best([rows[p.key] for p in told if p in space], constraints, objective)
                value = found[objective] if found else None
                scores.append(0.0 if value is None else (value / grid_best[objective] if higher else grid_best[objective] / value))
                used.append(len(told))
                cost = planning.cost(suite, told)
                registrations.append(cost.registrations)
                restarts.append(cost.restarts)
            results.setdefault(name, {})[given] = {
                "median": statistics.median(scores),
                "worst": min(scores),
                "points": statistics.mean(used),
                "registrations": statistics.mean(registrations),
                "restarts": statistics.mean(restarts),
            }
    return results


def render(results: dict) -> str:
    rows = [
        {
            "strategy": name,
            "budget": given,
            "points_used": r["points"],
            "best_found_over_grid_best_median": r["median"],
            "worst": r["worst"],
            "registrations": r["registrations"],
        }
        for name, by_budget in results.items()
        for given, r in by_budget.items()
    ]
    return render_table(rows, ["strategy", "budget", "points_used", "best_found_over_grid_best_median", "worst", "registrations"])


def main(result_dir: Path, catalog: Catalog, strategies: str, budgets: str, seeds: int, as_json: bool) -> int:
    if seeds < 1:
        raise UsageError(f"--seeds must be ≥ 1 (got {seeds})")
    results = replay(result_dir, catalog, strategies.split(","), budgets.split(","), seeds, log=(lambda _: None) if as_json else print)
    print(json.dumps(results) if as_json else render(results))
    return 0
