"""The auto strategy: find a pipeline's worker and batch configuration from its members' costs.

It measures the members first (each node's model served alone, at the suite's highest concurrency): a base
point (the middle value of every parameter) and, one parameter at a time, the base with each other value of
that parameter, within half the budget (batch sizes first). A member's throughput at any values is then the
base's times each parameter's measured effect (the nearest measured value where one is missing). Every
pipeline point is predicted from them: its nodes share the machine's cores, so one request costs the sum of
its nodes' times, and the pipeline serves 1 / Σ (1 / member throughput) at the values the point sets for each
node. A pipeline adds costs its members do not have (the frontend's hops between workflow nodes, the fused
worker's own loop), so each target's predictions are scaled by what its measured points showed (median
measured ÷ predicted); auto measures the best prediction of every target first, then the best corrected
prediction left, until the budget is spent. Each pipeline record carries `predicted_throughput_rps`, so the
report shows predicted against measured.
"""

import statistics

from segserve.bench.search.interface import Search, sorted_values
from segserve.bench.suite.params import node_param, workers_param
from segserve.bench.suite.plan import Point
from segserve.errors import UsageError


def _values(point: Point) -> dict:
    """A member point's parameters without the load (members are measured at one concurrency)."""
    return {name: value for name, value in point.params.items() if name != "concurrency"}


def _key(values: dict) -> tuple:
    return tuple(sorted(values.items(), key=lambda item: item[0]))


class MemberModel:
    """One member's throughput at any parameter values: the base point's, times each parameter's effect."""

    def __init__(self, points: list[Point]):
        self.options = {name: sorted_values({_values(p)[name] for p in points}) for name in _values(points[0])}
        self.base = {name: options[(len(options) - 1) // 2] for name, options in self.options.items()}
        self.by_key = {_key(_values(p)): p for p in points}
        self.measured: dict[tuple, float] = {}

    def design(self) -> list[Point]:
        """The base, then one parameter at a time (batch size first), as points of the grid."""
        wanted = [dict(self.base)]
        for name in sorted(self.options, key=lambda n: n != "batch_size"):
            wanted += [{**self.base, name: value} for value in self.options[name] if value != self.base[name]]
        return [self.by_key[_key(values)] for values in wanted if _key(values) in self.by_key]

    def tell(self, point: Point, throughput: float) -> None:
        self.measured[_key(_values(point))] = throughput

    def throughput(self, values: dict) -> float | None:
        exact = self.measured.get(_key(values))
        if exact is not None:
            return exact
        base = self.measured.get(_key(self.base))
        if base is None:
            return None
        result = base
        for name, value in values.items():
            options = self.options.get(name, [])
            if value not in options or value == self.base[name]:
                continue  # a value the member was not measured at counts as the base's
            # the measured value of this parameter nearest to the wanted one (the base counts as measured)
            measured = [v for v in options if v == self.base[name] or _key({**self.base, name: v}) in self.measured]
            nearest = min(measured, key=lambda v: abs(options.index(v) - options.index(value)))
            result *= self.measured.get(_key({**self.base, name: nearest}), base) / base
        return result


class AutoSearch(Search):
    def __init__(
        self,
        points: list[Point],
        limit: int | None = None,
        minutes: float | None = None,
        members: dict[str, dict[str, str]] | None = None,
        probes: list[Point] = (),
        objectives: list[str] = ("throughput_rps",),
    ):
        """points: the pipeline points to choose from; probes: the member points; members: pipeline target →
        {node: the target that serves its model alone}."""
        if list(objectives) != ["throughput_rps"]:
            raise UsageError(f"search.strategy auto predicts throughput_rps only (objectives: {', '.join(objectives)})")
        self.members = {target: nodes for target, nodes in (members or {}).items() if nodes}
        self.candidates = [p for p in points if p.target in self.members]
        if not probes or not self.candidates:
            raise UsageError(
                "search.strategy auto predicts pipelines from their members: list a workflow or fused target and "
                "the models of its nodes (for seg_jpeg: seg and jpeg) in targets"
            )
        super().__init__([*probes, *self.candidates], limit, minutes)
        top = max(p.params.get("concurrency", 0) for p in probes)
        at_top = [p for p in probes if p.params.get("concurrency", 0) == top]  # capacity: the highest load
        self.models = {m: MemberModel([p for p in at_top if p.target == m]) for m in dict.fromkeys(p.target for p in at_top)}
        designs = [model.design() for model in self.models.values()]
        # members in turn, so that a cut keeps every member's base and its batch sizes first
        queue = [design[i] for i in range(max(map(len, designs))) for design in designs if i < len(design)]
        if limit is not None:
            queue = queue[: max(len(designs), limit // 2)]
        self.queue = self.in_grid_order(queue)
        self.predicted: dict[str, float | None] = {}
        self.measured: dict[str, list[float]] = {}  # target → measured ÷ predicted of its points

    def propose(self) -> Point | None:
        if self.queue:
            return self.queue.pop(0)
        if not self.predicted:
            self.predicted = {p.run_id: self.predict(p) for p in self.candidates}
        rest = [p for p in self.unasked() if p.target in self.members and self.predicted.get(p.run_id)]
        if not rest:
            return None
        tried = {p.target for p in self.asked}
        untried = [p for p in rest if p.target not in tried]  # every target's best first: it calibrates the rest
        return max(untried or rest, key=self.corrected)

    def corrected(self, point: Point) -> float:
        ratios = self.measured.get(point.target)
        return self.predicted[point.run_id] * (statistics.median(ratios) if ratios else 1.0)

    def learn(self, point: Point, record: dict) -> None:
        value = None if record.get("error") else record.get("throughput_rps")
        if not value:
            return
        if point.target in self.models:
            self.models[point.target].tell(point, value)
        elif self.predicted.get(point.run_id):
            self.measured.setdefault(point.target, []).append(value / self.predicted[point.run_id])

    def annotate(self, point: Point) -> dict:
        predicted = self.predicted.get(point.run_id)
        return {"predicted_throughput_rps": predicted} if predicted else {}

    def predict(self, point: Point) -> float | None:
        """1 / Σ over the nodes of 1 / (the member's throughput at the values this point sets for the node)."""
        params, seconds = point.params, 0.0
        for node, member in self.members[point.target].items():
            model = self.models.get(member)
            if model is None:
                return None

            def wanted(name: str, node=node, member=member):
                if name == workers_param(member):
                    return params.get(workers_param(node), params.get("workers"))
                return params.get(node_param(node, name), params.get(name))

            throughput = model.throughput({name: wanted(name) for name in model.options})
            if not throughput:
                return None
            seconds += 1.0 / throughput
        return 1.0 / seconds

    def plan(self) -> list[Point]:
        return list(self.queue)
