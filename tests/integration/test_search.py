"""Search strategies over a synthetic space: every one answers from a known function, so what they find is exact."""

import pytest

from segserve.bench.search import make_strategy
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import Budget

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


@pytest.mark.parametrize(("sampler", "median_at_least"), [("gp", 0.95), ("tpe", 0.9)])
def test_optuna_finds_the_best_within_a_tenth_of_the_space_and_never_measures_twice(sampler, median_at_least):
    points = space()  # 120 points, one smooth peak: GP's model fits it closely, TPE's less
    best = max(throughput(p) for p in points)
    found = []
    for seed in range(5):
        asked = run(make_strategy("optuna", points, Budget(fraction=0.1), seed=seed, sampler=sampler))
        assert len(asked) == 12 and len(set(asked)) == 12
        found.append(max(throughput(p) for p in asked) / best)
    random_found = [max(throughput(p) for p in run(make_strategy("random", points, Budget(fraction=0.1), seed=s))) / best for s in range(5)]
    assert sorted(found)[2] >= median_at_least and sum(found) > sum(random_found)
