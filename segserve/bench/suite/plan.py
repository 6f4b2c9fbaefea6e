"""From a suite to its space of run points, what each point sets where, and what running points costs.

Every point of a target is a combination of the parameters that apply to it (segserve/bench/suite/params.py
says which). The grid order puts the server outermost, then the target, archive, runtime and load, so
the server restarts only when a server value changes and a target is re-registered only when an
archive value changes; runtime values (workers) change live and load values cost nothing.
"""

import hashlib
import itertools
import json
from dataclasses import dataclass

from segserve.archives.catalog import Catalog, Target
from segserve.archives.registration import workflow_entry, workflow_top
from segserve.bench.suite.params import PARAMS, at_level, node_param, node_value_applies, workers_param
from segserve.bench.suite.spec import Suite

# Rough costs for the estimate printed by --dry-run (measured on a 2-core machine).
RESTART_S, REGISTER_S, SCALE_S = 12.0, 6.0, 3.0

Params = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class Point:
    target: str
    server: Params
    archive: Params
    runtime: Params
    load: Params
    setup: str = ""  # digest of what else changes the measurement (load settings, inputs, recipe, server config)

    @property
    def params(self) -> dict:
        return dict(self.server + self.archive + self.runtime + self.load)

    @property
    def engine(self) -> str:
        """What serves the point: grid.server.engine's value, TorchServe where the suite gives none."""
        return dict(self.server).get("engine", "torchserve")

    @property
    def key(self) -> str:
        """The point's place in the space (target and parameters), whatever else it was measured with. TorchServe
        is the engine a point without one ran on: `engine: torchserve` leaves its key (and run id) as it was."""
        params = {k: v for k, v in self.params.items() if (k, v) != ("engine", "torchserve")}
        return hashlib.sha1(json.dumps([self.target, sorted(params.items())], default=str).encode()).hexdigest()[:8]

    @property
    def run_id(self) -> str:
        """Stable across runs of the same suite and setup, so --resume and `bench compare` can match points;
        another load, inputs, archive recipe or server config gives another id."""
        digest = hashlib.sha1(f"{self.key}:{self.setup}".encode()).hexdigest()
        return f"{self.target}-{digest[:8]}"

    @property
    def workers(self) -> dict[str, int]:
        """Workers per node (`<node>_workers`), or of the one model ({"workers": n})."""
        runtime = dict(self.runtime)
        if "workers" in runtime:
            return {"workers": runtime["workers"]}
        return {name.removesuffix("_workers"): count for name, count in runtime.items() if name.endswith("_workers")}

    @property
    def autoscaled(self) -> bool:
        return bool(dict(self.runtime).get("autoscale"))


def _axis(values: dict) -> list[Params]:
    """All combinations of {name: [values]} as sorted tuples of (name, value); None-valued names are left out."""
    names = sorted(name for name, options in values.items() if options is not None)
    return [tuple(zip(names, combo, strict=True)) for combo in itertools.product(*(values[n] for n in names))]


def archive_values(suite: Suite, target: Target) -> dict:
    """The archive-level parameters that apply to a target, DAG-wide and per node, with the suite's values."""
    archive = suite.grid.archive
    params = at_level("archive")
    if target.name in suite.archive_targets:  # a user's handlers: only TorchServe's registration values apply
        params = [p for p in params if p.registration]
    values = {p.name: getattr(archive, p.name) for p in params if p.applies_to_handlers(target.handlers) and p.applies_to_target(target)}
    if target.is_model:
        return values
    by_node = {node.name: node.model.handler for node in target.nodes}
    for node, given in archive.nodes.items():
        if node not in by_node:
            continue
        for name, options in given.model_dump(exclude_none=True).items():
            if PARAMS[name] in params and node_value_applies(PARAMS[name], by_node[node], target):
                values[node_param(node, name)] = options
    return values


def runtime_axis(suite: Suite, target: Target) -> list[Params]:
    runtime = suite.grid.runtime
    if not target.scaled_nodes:  # the fused twin: one model runs every node
        return _axis({"workers": runtime.workers})
    per_node = {node: getattr(runtime, workers_param(node), None) for node in target.scaled_nodes}
    if all(v is None for v in per_node.values()) and len(per_node) > 1:
        # Only `workers` given: the same count for every node, not every combination.
        splits = [tuple((workers_param(node), w) for node in sorted(per_node)) for w in runtime.workers]
    else:
        splits = _axis({workers_param(node): values or runtime.workers for node, values in per_node.items()})
    if runtime.autoscale is None or len(per_node) < 2:  # the autoscaler moves workers between a workflow's nodes
        return splits
    # An autoscaled point starts from its split and keeps its total; one worker per node leaves nothing to move.
    return sorted(
        split + (("autoscale", on),)
        for split in splits
        for on in runtime.autoscale
        if not on or sum(count for _, count in split) > len(per_node)
    )


def expand(suite: Suite, catalog: Catalog, setups: dict[str, str] | None = None) -> list[Point]:
    """Every point of the suite in the grid's order; `setups`: target → its setup digest."""
    grid, setups = suite.grid, setups or {}
    order = [*catalog.targets, *suite.outside_targets]
    load_axis = _axis(grid.load.model_dump())
    points = []
    for name in sorted(suite.target_names, key=order.index):
        if name in suite.outside_targets:  # no server of ours: load parameters, and a command's own knobs
            command = suite.command_targets.get(name)
            own = _axis(command.params) if command else [()]
            points += [Point(name, knobs, (), (), load, setups.get(name, "")) for knobs in own for load in load_axis]
            continue
        target = catalog.targets[name]
        axes = (_axis(grid.server.model_dump()), _axis(archive_values(suite, target)), runtime_axis(suite, target), load_axis)
        points += [Point(name, *combo, setups.get(name, "")) for combo in itertools.product(*axes)]
    # Cheapest order: server settings outermost, then target, archive, runtime, load; commands after TorchServe's.
    commands = suite.command_targets
    return sorted(
        points,
        key=lambda p: (p.target in commands, repr(p.server), order.index(p.target), repr(p.archive), repr(p.runtime), repr(p.load)),
    )


def settings_for(point: Point, target: Target) -> tuple[dict[str, dict], dict, dict[str, dict]]:
    """What a point sets where: (node → `handler:` settings, the fused worker's settings, node → TorchServe
    registration values as a workflow spec's `models:` spells them, archives/registration.py's workflow keys);
    per-node values override DAG-wide ones."""
    params = dict(point.archive)
    node_settings: dict[str, dict] = {}
    stage: dict = {}
    registration: dict[str, dict] = {}
    for node in target.nodes:
        handlers = {node.model.handler}
        for param in (PARAMS[name] for name in PARAMS if PARAMS[name].level == "archive"):
            for given in (param.name, node_param(node.name, param.name)):  # DAG-wide first, then the node's own
                if given not in params or not param.applies_to_handlers(handlers):
                    continue
                value = params[given]
                if param.registration:  # in a workflow spec's spelling and unit: what TorchServe reads there
                    registration.setdefault(node.name, {}).update(workflow_entry({param.name: value}))
                elif param.stage and target.is_fused:
                    stage.update(param.handler_settings(value))
                else:
                    node_settings.setdefault(node.name, {}).update(param.handler_settings(value))
    return node_settings, stage, registration


def spec_values(point: Point, target: Target, registration: dict[str, dict]) -> dict:
    """What a workflow point writes into its .war's `models:` (registration.write_models): its DAG-wide timeout and
    retries at the top level, the only values a function node takes, then each node's `registration`
    (settings_for's) and workers."""
    nodes = {node.name: {**registration.get(node.name, {}), **workflow_entry({}, point.workers.get(node.name))} for node in target.nodes}
    return {**workflow_top(dict(point.archive)), **nodes}


def swept(points: list[Point]) -> list[str]:
    """Parameters that take more than one value across the points (each gets a summary column)."""
    values: dict[str, set] = {}
    for point in points:
        for name, value in point.params.items():
            values.setdefault(name, set()).add(repr(value))
    return sorted(name for name, seen in values.items() if len(seen) > 1)


@dataclass
class PlanCost:
    points: int
    restarts: int
    registrations: int
    scale_calls: int
    estimate_min_s: float
    estimate_max_s: float


def cost(suite: Suite, points: list[Point]) -> PlanCost:
    restarts = registrations = scales = 0
    previous = None
    for point in points:
        if point.target in suite.http_targets:
            pass  # nothing of ours to start
        elif point.target in suite.command_targets:  # a command started again for each of its own settings
            restarts += previous is None or (previous.target, previous.server) != (point.target, point.server)
        elif previous is None or previous.target in suite.outside_targets or point.server != previous.server:
            restarts += 1
            registrations += 1
        elif (point.target, point.archive) != (previous.target, previous.archive):
            registrations += 1
        elif point.runtime != previous.runtime:
            scales += 1
        previous = point
    load = suite.load
    if load.phases:  # every point runs every phase once, after its warm-up
        phases_s = len(points) * sum(phase.duration_s for phase in load.phases)
        fixed_s = restarts * RESTART_S + registrations * REGISTER_S + scales * SCALE_S + len(points) * load.warmup_s
        return PlanCost(len(points), restarts, registrations, scales, fixed_s + phases_s, fixed_s + phases_s)
    fixed_s = (
        restarts * RESTART_S
        + registrations * REGISTER_S
        + scales * SCALE_S
        + len(points) * load.warmup_s
        + (registrations + scales) * load.fresh_workers_warmup_s
    )
    return PlanCost(
        len(points),
        restarts,
        registrations,
        scales,
        fixed_s + len(points) * load.stable_windows * load.window_s,
        fixed_s + len(points) * load.max_windows * load.window_s,
    )


def describe(suite: Suite, points: list[Point]) -> str:
    """The --dry-run text: every point, then the totals."""
    lines = [f"suite {suite.name}: {len(points)} points"]
    for index, point in enumerate(points, 1):
        params = " ".join(f"{k}={v}" for k, v in point.params.items())
        lines.append(f"  {index:3d}. {point.run_id:24s} {params}")
    c = cost(suite, points)
    lines.append(
        f"{c.points} points, {c.restarts} server start(s), {c.registrations} registration(s), {c.scale_calls} live scale call(s); "
        f"estimated {c.estimate_min_s / 60:.1f}–{c.estimate_max_s / 60:.1f} min"
    )
    return "\n".join(lines)
