"""random: a seeded sample of the budget's size, measured in the grid's order."""

import random

from segserve.bench.search.interface import Search
from segserve.bench.suite.plan import Point


class RandomSearch(Search):
    """A seeded sample of the budget's size, measured in the grid's order (a budget in minutes: all, shuffled)."""

    def __init__(self, points: list[Point], limit: int | None = None, minutes: float | None = None, seed: int = 0):
        super().__init__(points, limit, minutes)
        rng = random.Random(seed)
        sample = rng.sample(self.points, min(limit or len(self.points), len(self.points)))
        self.queue = self.in_grid_order(sample) if limit is not None else sample

    def propose(self) -> Point | None:
        return self.queue.pop(0) if self.queue else None

    def plan(self) -> list[Point]:
        return list(self.queue)
