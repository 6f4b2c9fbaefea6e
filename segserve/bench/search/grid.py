"""grid: every point, in order (with a budget: the first ones, as a grid stopped early)."""

from segserve.bench.search.interface import Search
from segserve.bench.suite.plan import Point


class GridSearch(Search):
    """Every point once, in the plan's order (restarts and re-registrations only where values change)."""

    def __init__(self, points: list[Point], limit: int | None = None, minutes: float | None = None):
        super().__init__(points, limit, minutes)

    def propose(self) -> Point | None:
        rest = self.unasked()
        return rest[0] if rest else None
