"""`segserve bench replay RESULTS --strategy grid,random,optuna,auto --budget 0.05,0.1,0.2 --seeds 20`: judge
search strategies without noise. Every point a strategy proposes is answered from a complete recorded grid
(no server), so two strategies see the same machine; the score of a run is the best point it found ÷ the
grid's best (objective and constraints of the recorded suite), over the candidate points (members served
alone are auto's probes, not candidates).
"""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.results.render import render_table
from segserve.bench.results.store import read_runs, read_summary
from segserve.bench.run.suite_run import members_of
from segserve.bench.search import STRATEGIES, candidates, make_strategy
from segserve.bench.suite import plan as planning
from segserve.bench.suite.columns import METRICS, best
from segserve.bench.suite.spec import Budget, load_suite
from segserve.errors import UsageError
from segserve.machine.identity import label, machines_of


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
    constraints = suite.constraint_bounds
    members = members_of(suite, catalog)
    space = candidates(points, members)
    grid_best = best([rows[p.key] for p in space], constraints, objective)
    if grid_best is None:
        raise UsageError(f"{result_dir}: no candidate point meets the suite's constraints: nothing to find")
    higher = METRICS[objective].higher_is_better
    machines = machines_of(read_runs(result_dir).values())
    if len(machines) > 1:  # a grid resumed elsewhere: its points are not one machine's, and its best may be neither's
        log(f"warning: the grid's points were measured on {len(machines)} machines: {'; '.join(label(m) for m in machines)}")
    elif machines:
        log(f"grid recorded on {label(machines[0])}: the scores hold for that machine")
    log(f"{len(space)} candidate points; grid best {objective} {grid_best[objective]:.4g} ({grid_best['run_id']})")
    results: dict[str, dict] = {}
    for name in strategies:
        for given in budgets:
            budget = parse_budget(given)
            scores, used, registrations, restarts, close = [], [], [], [], 0
            for seed in range(seeds):
                # the recorded suite's sampler and batch, if it has a search section
                settings = suite.search.model_copy(update={"strategy": name, "budget": budget, "seed": seed})
                strategy = make_strategy(settings, points, members, [objective], constraints)
                told = []
                while (point := strategy.ask()) is not None:
                    record = rows[point.key]
                    strategy.tell(point, record)
                    told.append(point)
                found = best([rows[p.key] for p in told if p in space], constraints, objective)
                value = found[objective] if found else None
                scores.append(0.0 if value is None else (value / grid_best[objective] if higher else grid_best[objective] / value))
                close += found is not None and indistinguishable(found, grid_best, objective, higher)
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
                # seeds whose best lies within the grid best's own 95% window interval: as good as it, as measured
                "within_noise": close,
                "seeds": seeds,
            }
    return results


def indistinguishable(found: dict, grid_best: dict, objective: str, higher: bool) -> bool:
    """Whether a found point cannot be told apart from the grid's best: its objective within the best's own
    interval from its recorded windows (throughput: throughput_ci_low_rps…high); a metric without an
    interval only by being equal."""
    if found is grid_best or found.get("run_id") == grid_best.get("run_id"):
        return True
    prefix = objective.removesuffix("_rps")
    low, high = grid_best.get(f"{prefix}_ci_low_rps"), grid_best.get(f"{prefix}_ci_high_rps")
    value = found.get(objective)
    if value is None or low is None or high is None:
        return False
    return value >= low if higher else value <= high


def render(results: dict) -> str:
    rows = [
        {
            "strategy": name,
            "budget": given,
            "points_used": r["points"],
            "best_found_over_grid_best_median": r["median"],
            "worst": r["worst"],
            "registrations": r["registrations"],
            "within_noise_of_best": f"{r['within_noise']}/{r['seeds']}",
        }
        for name, by_budget in results.items()
        for given, r in by_budget.items()
    ]
    columns = ["strategy", "budget", "points_used", "best_found_over_grid_best_median", "worst", "within_noise_of_best", "registrations"]
    return render_table(rows, columns)


@dataclass(frozen=True)
class ReplayRun:
    """`segserve bench replay RESULTS`'s options."""

    result_dir: Path  # a complete recorded grid
    catalog: Catalog
    strategies: str  # comma-separated: grid,random,optuna,auto
    budgets: str  # comma-separated fractions of the candidates or whole numbers of points
    seeds: int
    as_json: bool = False


def main(run: ReplayRun) -> int:
    if run.seeds < 1:
        raise UsageError(f"--seeds must be ≥ 1 (got {run.seeds})")
    log = (lambda _: None) if run.as_json else print
    results = replay(run.result_dir, run.catalog, run.strategies.split(","), run.budgets.split(","), run.seeds, log=log)
    print(json.dumps(results) if run.as_json else render(results))
    return 0
