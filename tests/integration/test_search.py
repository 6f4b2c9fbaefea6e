"""Search strategies over a synthetic space: every one answers from a known function, so what they find is exact."""

import pytest

from segserve.bench.search import make_strategy
from segserve.bench.suite.spec import Budget, SearchSettings
from tests.unit.test_search import BATCHES, DELAYS, WORKERS, point, record, run, space, throughput  # noqa: F401 (fixtures among them)


@pytest.mark.parametrize(("sampler", "median_at_least"), [("gp", 0.95), ("tpe", 0.9)])
def test_optuna_finds_the_best_within_a_tenth_of_the_space_and_never_measures_twice(sampler, median_at_least):
    points = space()  # 120 points, one smooth peak: GP's model fits it closely, TPE's less
    best = max(throughput(p) for p in points)
    found = []
    for seed in range(5):
        asked = run(make_strategy(SearchSettings(strategy="optuna", budget=Budget(fraction=0.1), seed=seed, sampler=sampler), points))
        assert len(asked) == 12 and len(set(asked)) == 12
        found.append(max(throughput(p) for p in asked) / best)
    random_found = [
        max(throughput(p) for p in run(make_strategy(SearchSettings(strategy="random", budget=Budget(fraction=0.1), seed=s), points)))
        / best
        for s in range(5)
    ]
    assert sorted(found)[2] >= median_at_least and sum(found) > sum(random_found)
