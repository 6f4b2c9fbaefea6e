"""The bench's loop: the strategy proposes a point, it is resolved and measured (point.py, with the baselines beside
it: baselines.py), made a record, handed to every sink, and the strategy is told. The runner knows none of them
by name."""

import time

from segserve.archives.catalog import Catalog
from segserve.bench.run.baselines import AccuracyGate, AutoscalerBeside, BareForwardBeside
from segserve.bench.run.deploy import ClusterNodes, Deployment
from segserve.bench.run.point import PointMeasurement, ResolvedPoint, resolve
from segserve.bench.run.progress import Progress
from segserve.bench.run.rounds import combine_rounds, in_rounds
from segserve.bench.search import Strategy
from segserve.bench.suite.plan import Point


class Runner:
    def __init__(self, catalog: Catalog, deployment: Deployment, strategy: Strategy, sinks: list, bodies_for, log=print):
        self.catalog, self.deployment, self.strategy, self.sinks, self.log = catalog, deployment, strategy, sinks, log
        suite, torchserve = deployment.suite, deployment.torchserve
        hooks = (  # in this order before the load, the other way round after it
            AccuracyGate(deployment.weights, torchserve.compile_env, log),
            BareForwardBeside(deployment.weights, suite, torchserve.compile_env, log),
            AutoscalerBeside(torchserve, catalog, suite),
            ClusterNodes(deployment),  # last: its nodes' CPU sampled from just before the load
        )
        # bodies_for(target name[, phase]) → request bodies
        self.measurement = PointMeasurement(deployment, suite.load, bodies_for, hooks, strategy.pruner_for)

    def resolve(self, point: Point) -> ResolvedPoint:
        return resolve(point, self.catalog, self.deployment.torchserve.recipe)

    def run(self, done: dict[str, dict], base) -> list[dict]:
        """Measure what the strategy proposes; `done`: records of an earlier run of the same folder (a point
        measured without error is kept: its run id says it was measured the same way). `base(point)`: keys every
        record carries (environment, setup)."""
        records = []
        kept = sum(1 for p in self.strategy.plan() if not done.get(p.run_id, {}).get("error", True))
        progress = Progress(self.strategy.size() - kept, self.log)
        try:
            while (point := self.strategy.ask()) is not None:
                record = done.get(point.run_id)
                if record is None or record.get("error"):
                    started = time.monotonic()
                    notes = self.strategy.annotate(point)
                    record = {**self.measurement.measure(self.resolve(point)), **base(point), **notes}
                    for sink in self.sinks:
                        sink.add(record)
                    progress.step(point, record, time.monotonic() - started)
                self.strategy.tell(point, record)
                records.append(record)
        finally:
            self.strategy.close()
        return records

    def run_rounds(self, rounds: int, base) -> list[dict]:
        """Every point of the plan `rounds` times (rounds.in_rounds: the order reversed every other round, every
        model registered afresh each round), so that a slow spell or a lucky worker is one round's noise. One
        record per point (combine_rounds) to every sink."""
        points = self.strategy.plan()
        progress = Progress(len(points) * rounds, self.log)
        resolved = {point.run_id: self.resolve(point) for point in points}

        def measure(point: Point, _side) -> dict:
            started = time.monotonic()
            record = self.measurement.measure(resolved[point.run_id])
            progress.step(point, record, time.monotonic() - started)
            return record

        measured: dict = {}
        records = []
        try:
            in_rounds(points, rounds, measure, self.deployment.release, measured=measured)
        finally:
            # also when stopped part-way: what was measured reaches runs/ and the summary, `rounds` says how much
            for point in (p for p in points if (p.run_id, None) in measured):
                record = {**combine_rounds(measured[(point.run_id, None)]), **base(point)}
                for sink in self.sinks:
                    sink.add(record)
                records.append(record)
        return records
