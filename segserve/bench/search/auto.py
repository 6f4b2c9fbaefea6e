"""The auto strategy: find a pipeline's configuration by measuring the pipeline where it matters, guided by its
members' costs.

In order:
1. Each member's base point (its model served alone, at the suite's highest concurrency, at the middle value of
   every parameter): a member's throughput at any values is its base's times each parameter's measured effect
   (the nearest measured value where one is missing), and a pipeline point is predicted from them: its nodes
   share the machine's cores, so one request costs the sum of its nodes' times, and the pipeline serves
   1 / Σ (1 / member throughput) at the values the point sets for each node.
2. Each pipeline target's anchor: its largest worker counts, the middle value of everything else. Workers are the
   largest effect on a machine's cores, and a member measured alone at one worker count cannot show it (on the
   recorded grids, auto at 10% never probed a second fused worker and found 0.66 of the best).
3. A line search from the best pipeline point measured so far, one parameter at a time (batch size, then the
   batch delay, then the other archive parameters, then the workers of each node): every value of that
   parameter, nearest first, then on from the best point measured.
4. The rest of the members' design (one parameter at a time from the base, batch sizes first), within half the
   budget with the bases.
5. The best predictions left, each target's scaled by what its measured points showed (median measured ÷
   predicted): a pipeline adds costs its members do not have (the frontend's hops between workflow nodes, the
   fused worker's own loop).
Each pipeline record carries `predicted_throughput_rps` (from the members' measurements so far), so the report
shows predicted against measured.
"""

import statistics

from segserve.bench.search.interface import Search, sorted_values
from segserve.bench.suite.params import node_param, workers_param
from segserve.bench.suite.plan import Point
from segserve.errors import UsageError


def _options(points: list[Point]) -> dict[str, list]:
    """Every parameter the points vary, with its values in order."""
    values = {name: {p.params[name] for p in points} for name in points[0].params}
    return {name: sorted_values(found) for name, found in values.items() if len(found) > 1}


def _values(point: Point) -> dict:
    """A member point's parameters without the load (members are measured at one concurrency)."""
    return {name: value for name, value in point.params.items() if name != "concurrency"}


def _key(values: dict) -> tuple:
    return tuple(sorted(values.items(), key=lambda item: item[0]))


def _line_order(name: str) -> tuple:
    return (name.endswith("workers"), name != "batch_size", name != "max_batch_delay_ms")


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
        bases = [design[0] for design in designs]
        # the rest of the members' design in turn (a cut keeps every member's batch sizes first), within half the budget
        rest = [design[i] for i in range(1, max(map(len, designs))) for design in designs if i < len(design)]
        self.member_rest = self.in_grid_order(rest[: max(0, limit // 2 - len(bases))] if limit is not None else rest)
        self.options = {t: _options([p for p in self.candidates if p.target == t]) for t in self.members}
        anchors = [a for a in map(self.anchor, self.members) if a is not None]
        self.queue = self.in_grid_order(bases) + anchors
        self.lines: list[str] | None = None  # the parameters still to search along, from the best point measured
        self.line: list[Point] = []
        self.predicted: dict[str, float | None] = {}
        self.measured: dict[str, list[float]] = {}  # target → measured ÷ predicted of its points

    def anchor(self, target: str) -> Point | None:
        """The target's point with its largest worker counts and the middle value of every other parameter."""
        wanted = {n: o[-1] if n.endswith("workers") else o[(len(o) - 1) // 2] for n, o in self.options[target].items()}
        return next((p for p in self.candidates if p.target == target and all(p.params[n] == v for n, v in wanted.items())), None)

    def propose(self) -> Point | None:
        if self.queue:
            return self._predicted(self.queue.pop(0))
        if (point := self._next_on_line()) is not None:
            return self._predicted(point)
        asked = {p.run_id for p in self.asked}
        if rest := [p for p in self.member_rest if p.run_id not in asked]:
            return rest[0]
        rest = [p for p in self.unasked() if p.target in self.members and self._prediction(p)]
        return max(rest, key=self.corrected) if rest else None

    def _next_on_line(self) -> Point | None:
        """The next value of the parameter searched now, from the best pipeline point measured when its line began."""
        asked = {p.run_id for p in self.asked}
        while True:
            if todo := [p for p in self.line if p.run_id not in asked]:
                return todo[0]
            measured = {p: rps for p in self.asked if p.target in self.members and (rps := self._measured_rps(p))}
            if not measured:
                return None  # every pipeline point failed so far: the predictions choose
            best = max(measured, key=measured.get)
            if self.lines is None:  # batch size, the batch delay, the other archive parameters, each node's workers
                self.lines = sorted(self.options[best.target], key=_line_order)
            if not self.lines:
                return None
            self.line = self._along(best, self.lines.pop(0))

    def _along(self, point: Point, name: str) -> list[Point]:
        """The target's points that differ from `point` in `name` only, nearest value first (the larger at a tie)."""
        options = self.options[point.target].get(name)
        if options is None:
            return []
        here = options.index(point.params[name])
        others = {k: v for k, v in point.params.items() if k != name}
        same_target = [p for p in self.candidates if p.target == point.target]
        by_value = {p.params[name]: p for p in same_target if {k: v for k, v in p.params.items() if k != name} == others}
        order = sorted(range(len(options)), key=lambda i: (abs(i - here), -i))
        return [by_value[options[i]] for i in order if i != here and options[i] in by_value]

    def _predicted(self, point: Point) -> Point:
        """The point, its prediction made first if it is a pipeline's (kept for its record and the correction)."""
        if point.target in self.members:
            self._prediction(point)
        return point

    def _prediction(self, point: Point) -> float | None:
        """From the members measured so far (a member measured later clears the predictions not yet asked)."""
        if point.run_id not in self.predicted:
            self.predicted[point.run_id] = self.predict(point)
        return self.predicted[point.run_id]

    def _measured_rps(self, point: Point) -> float | None:
        record = self.told.get(point.run_id, {})
        return None if record.get("error") else record.get("throughput_rps")

    def corrected(self, point: Point) -> float:
        ratios = self.measured.get(point.target)
        return self.predicted[point.run_id] * (statistics.median(ratios) if ratios else 1.0)

    def learn(self, point: Point, record: dict) -> None:
        value = None if record.get("error") else record.get("throughput_rps")
        if not value:
            return
        if point.target in self.models:
            self.models[point.target].tell(point, value)
            asked = {p.run_id for p in self.asked}
            self.predicted = {k: v for k, v in self.predicted.items() if k in asked}  # the rest: predicted again
        elif point.target in self.members:
            if self.predicted.get(point.run_id):
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
