"""Search strategies: which point to measure next, told each result before they choose again.

The runner knows only this interface (as Model Analyzer's config generators): `ask()` the next point
(None: done), `tell(point, record)` what it measured; `plan()` is what it would propose with no feedback
(empty where every proposal depends on results) and `size()` the most points it will propose. Every strategy
works over the suite's points in the grid's (cheapest) order and stops at its budget: a number of points, or
minutes from its first proposal.

- grid: every point, in order (with a budget: the first ones, as a grid stopped early).
- random: a seeded sample of the budget's size, measured in the grid's order.
- optuna: Optuna's GP or TPE sampler over the grid's lists (numbers as ordered indices, the rest as
  categories); the suite's constraints as Optuna constraints (Trial.set_constraint), so infeasible points
  steer the search; one objective, or two for a Pareto front. With `batch` > 1 it proposes that many points
  at a time, measured in the grid's order, so that server restarts and re-registrations stay rare.
- auto: measures the members (the DAG's nodes served alone) first, predicts every pipeline point from them
  and measures the best predictions (segserve/bench/search/auto.py).

The factory below is the one place that knows the strategies by name; the runner sees only interface.Strategy.
"""

from segserve.bench.search.grid import GridSearch
from segserve.bench.search.interface import Strategy, budget_points
from segserve.bench.search.random_search import RandomSearch
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import SearchSettings
from segserve.errors import UsageError

STRATEGIES = ("grid", "random", "optuna", "auto")


def candidates(points: list[Point], members: dict[str, dict[str, str]]) -> list[Point]:
    """The points a search chooses among: all but the members of a pipeline the suite also lists (those are
    measured only by auto, to predict the pipelines)."""
    served_alone = {m for nodes in members.values() for m in nodes.values()}
    return [p for p in points if p.target not in served_alone]


def make_strategy(
    settings: SearchSettings,
    points: list[Point],
    members: dict[str, dict[str, str]] | None = None,
    objectives: list[str] = ("throughput_rps",),
    constraints: dict | None = None,
    storage=None,
    study_name: str | None = None,
) -> Strategy:
    """The suite's `search:` (strategy, budget of the candidates, seed, sampler, batch) over its points in the
    grid's order; grid without a budget measures every point, members too. `storage`, `study_name`: where an
    optuna search keeps its study."""
    name, budget, seed = settings.strategy, settings.budget, settings.seed
    members = members or {}
    space = candidates(points, members)
    limit = budget_points(budget, len(space))
    minutes = budget.minutes if budget is not None else None
    if name == "grid":
        return GridSearch(points if budget is None else space, limit if budget is not None else None, minutes)
    if name == "random":
        return RandomSearch(space, limit, minutes, seed=seed)
    if name == "optuna":
        from segserve.bench.search.optuna_search import OptunaSearch

        return OptunaSearch(space, limit, minutes, seed, objectives, constraints, settings.sampler, storage, study_name, settings.batch)
    if name == "auto":
        from segserve.bench.search.auto import AutoSearch

        probes = [p for p in points if p not in space]
        return AutoSearch(space, limit, minutes, members=members, probes=probes, objectives=objectives)
    raise UsageError(f"unknown search strategy {name!r}: one of {', '.join(STRATEGIES)}")
