"""The search interface and what every strategy shares: the budget, the grid's order, sorted values.

The runner knows only this interface (as Model Analyzer's config generators): `ask()` the next point
(None: done), `tell(point, record)` what it measured; `plan()` is what it would propose with no feedback
(empty where every proposal depends on results) and `size()` the most points it will propose. Every strategy
works over the suite's points in the grid's (cheapest) order and stops at its budget: a number of points, or
minutes from its first proposal.
"""

import time
from typing import Protocol

from segserve.bench.suite.plan import Point
from segserve.errors import UsageError


class Strategy(Protocol):
    def ask(self) -> Point | None: ...

    def tell(self, point: Point, record: dict) -> None: ...

    def plan(self) -> list[Point]: ...

    def size(self) -> int: ...

    def annotate(self, point: Point) -> dict: ...

    def pruner_for(self, point: Point): ...

    def kept_study(self): ...

    def abandon_running(self) -> None: ...

    def reseed(self, extra: int) -> None: ...

    def close(self) -> None: ...


def budget_points(budget, space_size: int) -> int | None:
    """How many points a budget allows: the grid's size without one, None for a budget in minutes."""
    if budget is None:
        return space_size
    if budget.points is not None:
        if budget.points > space_size:
            raise UsageError(f"search.budget.points: {budget.points} is more than the {space_size} points of the space")
        return budget.points
    if budget.fraction is not None:
        return max(1, round(budget.fraction * space_size))
    return None


class Search:
    """What every strategy shares: the space in the grid's order, the budget, and what it was told (a point
    proposed again is answered from it, not measured again). Subclasses choose in `propose`."""

    def __init__(self, points: list[Point], limit: int | None, minutes: float | None = None, clock=time.monotonic):
        self.points = list(points)
        self.order = {p.run_id: index for index, p in enumerate(self.points)}
        self.limit, self.minutes, self.clock = limit, minutes, clock
        self.deadline: float | None = None
        self.asked: list[Point] = []
        self.told: dict[str, dict] = {}

    def spent(self) -> bool:
        if self.minutes is not None:
            self.deadline = self.deadline or self.clock() + 60 * self.minutes
            if self.clock() >= self.deadline:
                return True
        return self.used() >= self.size()

    def used(self) -> int:
        """Points proposed so far (a shared study: by every process)."""
        return len(self.asked)

    def ask(self) -> Point | None:
        if self.spent():
            return None
        point = self.propose()
        if point is not None:
            self.asked.append(point)
        return point

    def tell(self, point: Point, record: dict) -> None:
        self.told[point.run_id] = record
        self.learn(point, record)

    def unasked(self) -> list[Point]:
        taken = {p.run_id for p in self.asked}
        return [p for p in self.points if p.run_id not in taken]

    def in_grid_order(self, points: list[Point]) -> list[Point]:
        return sorted(points, key=lambda p: self.order[p.run_id])

    def propose(self) -> Point | None:
        raise NotImplementedError

    def learn(self, point: Point, record: dict) -> None:
        pass

    def plan(self) -> list[Point]:
        """Without feedback: what the strategy starts with (the whole budget for grid and random)."""
        return self.points[: self.limit]

    def size(self) -> int:
        """The most points it will propose (a budget in minutes: the whole space)."""
        return min(self.limit or len(self.points), len(self.points))

    def annotate(self, point: Point) -> dict:
        """Columns of its own for a point's record before it is written (auto: why it chose the point)."""
        return {}

    def pruner_for(self, point: Point):
        """A function of a point's window rates so far → True when it is hopeless (stop measuring it); None: none."""
        return None

    def kept_study(self):
        """The Optuna study its trials are kept in (a results folder's, or one shared by many processes); None."""
        return None

    def abandon_running(self) -> None:
        """Trials a killed run of the same study left running are given up (--resume); nothing without a study."""

    def reseed(self, extra: int) -> None:
        """Another process asks the same shared study: sample apart from it; nothing without a study."""

    def close(self) -> None:
        """Put back what it proposed and never heard of (a run stopped midway); nothing without a study."""


def ordered(values: list) -> bool:
    """All numbers: values an ordered parameter takes, as indices into their sorted list."""
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def sorted_values(values: set) -> list:
    """Numbers in order; anything else by type, then text (a stable order for categories)."""
    return sorted(values) if ordered(list(values)) else sorted(values, key=lambda v: (type(v).__name__, str(v)))
