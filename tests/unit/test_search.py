"""Search strategies over a synthetic space: every one answers from a known function, so what they find is exact."""

import pytest

from segserve.bench.search import budget_points, make_strategy
from segserve.bench.search.optuna_search import Space
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import Budget, SearchSettings
from segserve.errors import UsageError

BATCHES = [1, 2, 4, 8, 16, 32]
DELAYS = [0, 5, 10, 20, 50]
WORKERS = [1, 2, 3, 4]


def point(target: str, batch: int, delay: int, workers: int, concurrency: int = 16, workers_name: str = "workers") -> Point:
    archive = (("batch_size", batch), ("max_batch_delay_ms", delay))
    return Point(target, (), archive, ((workers_name, workers),), (("concurrency", concurrency),))


def space(target: str = "seg_jpeg") -> list[Point]:
    return [point(target, b, d, w) for b in BATCHES for d in DELAYS for w in WORKERS]


def throughput(p: Point) -> float:
    """One best point (batch 8, delay 10, 2 workers), falling off smoothly in every direction."""
    params = p.params
    return (
        100.0
        - 6 * abs(BATCHES.index(params["batch_size"]) - 3)
        - 4 * abs(DELAYS.index(params["max_batch_delay_ms"]) - 2)
        - 9 * abs(WORKERS.index(params.get("workers", params.get("seg_workers", 1))) - 1)
    )


def record(p: Point) -> dict:
    return {"run_id": p.run_id, "target": p.target, "throughput_rps": throughput(p), "latency_p99_ms": 1000.0 / throughput(p)}


def run(strategy, answer=record) -> list[Point]:
    asked = []
    while (p := strategy.ask()) is not None:
        asked.append(p)
        strategy.tell(p, answer(p))
    return asked


def test_budgets_in_points_fractions_and_too_large():
    assert budget_points(None, 120) == 120
    assert budget_points(Budget(fraction=0.1), 120) == 12
    assert budget_points(Budget(points=40), 120) == 40
    assert budget_points(Budget(minutes=5), 120) is None
    with pytest.raises(UsageError, match="more than the 120 points"):
        budget_points(Budget(points=121), 120)
    with pytest.raises(ValueError, match="exactly one"):
        Budget(points=3, fraction=0.1)


def test_grid_with_a_budget_measures_the_first_points_in_order():
    points = space()
    assert run(make_strategy(SearchSettings(strategy="grid", budget=Budget(points=7)), points)) == points[:7]
    assert run(make_strategy(SearchSettings(strategy="grid"), points)) == points


def test_random_measures_a_seeded_sample_in_the_grids_order():
    points = space()
    first = run(make_strategy(SearchSettings(strategy="random", budget=Budget(fraction=0.1), seed=3), points))
    assert len(first) == 12 and len(set(first)) == 12
    assert first == sorted(first, key=points.index)  # restarts only where values change
    assert run(make_strategy(SearchSettings(strategy="random", budget=Budget(fraction=0.1), seed=3), points)) == first
    assert run(make_strategy(SearchSettings(strategy="random", budget=Budget(fraction=0.1), seed=4), points)) != first


def test_space_maps_suggestions_to_grid_points_and_back():
    import optuna

    points = space() + space("seg_jpeg_fused")
    mapping = Space(points)
    study = optuna.create_study()
    for p in points[::17]:
        study.enqueue_trial(mapping.trial_params(p))
        assert mapping.suggest(study.ask()) == p


def test_optuna_steers_away_from_points_that_break_a_constraint():
    # every point with more than one worker breaks a latency bound: the best feasible is batch 8, delay 10, 1 worker
    def answer(p):
        r = record(p)
        r["latency_p99_ms"] = 500.0 if p.params["workers"] > 1 else 50.0
        return r

    constraints = {"latency_p99_ms": {"max": 100}}
    asked = run(
        make_strategy(SearchSettings(strategy="optuna", budget=Budget(points=30), seed=1, sampler="tpe"), space(), constraints=constraints),
        answer,
    )
    late = asked[15:]
    assert sum(p.params["workers"] == 1 for p in late) > len(late) / 2


def test_optuna_with_two_objectives_and_a_budget_in_minutes():
    clock = iter(range(0, 10_000, 30))  # every look at the clock: 30 s later
    strategy = make_strategy(
        SearchSettings(strategy="optuna", budget=Budget(minutes=2), sampler="tpe"), space(), objectives=["throughput_rps", "latency_p99_ms"]
    )
    strategy.clock = lambda: next(clock)
    asked = run(strategy)
    assert 1 <= len(asked) <= 4
    assert all(len(t.values) == 2 for t in strategy.study.trials if t.values)


def test_failed_points_are_told_as_failed_and_the_search_goes_on():
    asked = run(
        make_strategy(SearchSettings(strategy="optuna", budget=Budget(points=10), seed=0), space()),
        lambda p: {"run_id": p.run_id, "error": "RuntimeFailure: x"},
    )
    assert len(asked) == 10


def test_unknown_strategy_is_refused():
    with pytest.raises(UsageError, match="unknown search strategy 'bayes'"):
        make_strategy(SearchSettings.model_construct(strategy="bayes"), space())  # past the suite's own check


def members_space() -> tuple[list[Point], dict]:
    seg = [point("seg", b, 5, w, workers_name="seg_workers") for b in BATCHES for w in WORKERS]
    jpeg = [point("jpeg", b, 5, w, workers_name="jpeg_workers") for b in BATCHES for w in WORKERS]
    pipeline = [
        Point(
            "seg_jpeg",
            (),
            (("batch_size", b), ("max_batch_delay_ms", 5)),
            (("jpeg_workers", j), ("seg_workers", s)),
            (("concurrency", 16),),
        )
        for b in BATCHES
        for s in WORKERS
        for j in WORKERS
    ]
    return seg + jpeg + pipeline, {"seg_jpeg": {"seg": "seg", "jpeg": "jpeg"}}


def pipeline_truth(p: Point) -> float:
    """Members: seg best at batch 8 with 2 workers (60 req/s), jpeg 400 req/s; the pipeline 10% below the
    harmonic combination, and below it more when the two nodes have more workers than cores."""
    params = p.params
    seg = 60.0 - 5 * abs(BATCHES.index(params["batch_size"]) - 3) - 8 * abs(params.get("seg_workers", 1) - 2)
    jpeg = 400.0 - 20 * abs(params.get("jpeg_workers", 1) - 1)
    if p.target == "seg":
        return seg
    if p.target == "jpeg":
        return jpeg
    return 0.9 / (1 / seg + 1 / jpeg)


def test_auto_measures_the_members_bases_then_the_pipeline_most_parallel_then_one_parameter_at_a_time():
    points, members = members_space()
    strategy = make_strategy(SearchSettings(strategy="auto", budget=Budget(points=60)), points, members=members)
    answered = {}

    def answer(p):
        answered[p.run_id] = {"run_id": p.run_id, "target": p.target, "throughput_rps": pipeline_truth(p), **strategy.annotate(p)}
        return answered[p.run_id]

    asked = run(strategy, answer)
    assert len(asked) == 60 and len({p.run_id for p in asked}) == 60
    # each member's base (batch 4, 2 workers), then the pipeline's anchor: its most workers, the middle batch size
    assert [p.target for p in asked[:3]] == ["seg", "jpeg", "seg_jpeg"]
    anchor = asked[2].params
    assert (anchor["batch_size"], anchor["jpeg_workers"], anchor["seg_workers"]) == (4, 4, 4)
    # the anchor is predicted from the bases alone (a worker count not measured counts as the base's)
    assert answered[asked[2].run_id]["predicted_throughput_rps"] == pytest.approx(1 / (1 / 55 + 1 / 380))
    # then every batch size from the best point so far, nearest first; then each node's workers from the best then
    assert [p.params["batch_size"] for p in asked[3:8]] == [8, 2, 16, 1, 32]
    assert [(p.params["batch_size"], p.params["jpeg_workers"]) for p in asked[8:11]] == [(8, 3), (8, 2), (8, 1)]
    assert [(p.params["jpeg_workers"], p.params["seg_workers"]) for p in asked[11:14]] == [(1, 3), (1, 2), (1, 1)]
    best = max(pipeline_truth(p) for p in points if p.target == "seg_jpeg")
    assert max(pipeline_truth(p) for p in asked[2:14]) == pytest.approx(best)  # found in 12 of the 96 pipeline points
    # then the rest of the members' design (within half the budget), then the best predictions left
    assert {p.target for p in asked[14:30]} == {"seg", "jpeg"} and {p.target for p in asked[30:]} == {"seg_jpeg"}
    assert all(answered[p.run_id]["predicted_throughput_rps"] > 0 for p in asked[30:])


def test_auto_needs_the_members_of_a_pipeline():
    points, _ = members_space()
    with pytest.raises(UsageError, match="the models of its nodes"):
        make_strategy(SearchSettings(strategy="auto", budget=Budget(points=10)), [p for p in points if p.target == "seg_jpeg"], members={})
