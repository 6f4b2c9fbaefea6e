"""Search strategies: which point to measure next, told each result before they choose again.

The runner knows only this interface (as Model Analyzer's config generators): `ask()` the next point
(None: done), `tell(point, record)` what it measured. `plan()` is what the strategy would propose with no
feedback, for --dry-run. The grid is the first strategy: every point, in the cheapest order.
"""

from typing import Protocol

from segserve.bench.plan import Point


class Strategy(Protocol):
    def ask(self) -> Point | None: ...

    def tell(self, point: Point, record: dict) -> None: ...

    def plan(self) -> list[Point]: ...


class GridSearch:
    """Every point once, in the plan's order (restarts and re-registrations only where values change)."""

    def __init__(self, points: list[Point]):
        self.points = list(points)
        self.next_index = 0
        self.results: dict[str, dict] = {}

    def ask(self) -> Point | None:
        if self.next_index >= len(self.points):
            return None
        self.next_index += 1
        return self.points[self.next_index - 1]

    def tell(self, point: Point, record: dict) -> None:
        self.results[point.run_id] = record

    def plan(self) -> list[Point]:
        return list(self.points)


STRATEGIES = {"grid": GridSearch}


def make_strategy(name: str, points: list[Point]) -> Strategy:
    return STRATEGIES[name](points)
