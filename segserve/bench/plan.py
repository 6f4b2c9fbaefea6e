"""From a suite to an ordered list of run points, and what running them costs.

Points are ordered so that the server restarts only when a server-level value
changes and a target is re-registered only when an archive-level value
changes; runtime values (workers) are changed live and load values cost nothing.
"""

import hashlib
import itertools
import json
from dataclasses import dataclass

from segserve.bench.suite import Suite

TARGET_ORDER = ("seg", "jpeg", "seg_jpeg", "seg_jpeg_fused")
STAGES = {"seg": ("seg",), "jpeg": ("jpeg",), "seg_jpeg": ("seg", "jpeg"), "seg_jpeg_fused": ("seg", "jpeg")}
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

    @property
    def params(self) -> dict:
        return dict(self.server + self.archive + self.runtime + self.load)

    @property
    def run_id(self) -> str:
        """Stable across runs of the same suite, so --resume and `bench compare` can match points."""
        digest = hashlib.sha1(json.dumps([self.target, sorted(self.params.items())], default=str).encode()).hexdigest()
        return f"{self.target}-{digest[:8]}"

    @property
    def workers(self) -> dict[str, int]:
        """Workers per registered model name suffix: {"seg": 1} or {"seg": 1, "jpeg": 2}; fused: {"seg_jpeg_fused": n}."""
        runtime = dict(self.runtime)
        if "workers" in runtime:
            return {self.target: runtime["workers"]}
        return {stage: runtime[f"{stage}_workers"] for stage in STAGES[self.target]}


def _axis(values: dict) -> list[Params]:
    """All combinations of {name: [values]} as sorted tuples of (name, value); None-valued names are left out."""
    names = sorted(name for name, options in values.items() if options is not None)
    return [tuple(zip(names, combo, strict=True)) for combo in itertools.product(*(values[n] for n in names))]


def _runtime_axis(suite: Suite, target: str) -> list[Params]:
    runtime = suite.grid.runtime
    if target == "seg_jpeg_fused":  # one model runs both stages
        return _axis({"workers": runtime.workers})
    per_stage = {stage: getattr(runtime, f"{stage}_workers") for stage in STAGES[target]}
    if all(v is None for v in per_stage.values()) and len(per_stage) > 1:
        # Only `workers` given: the same count for every node, not every combination.
        return [tuple((f"{stage}_workers", w) for stage in STAGES[target]) for w in runtime.workers]
    return _axis({f"{stage}_workers": values or runtime.workers for stage, values in per_stage.items()})


def expand(suite: Suite) -> list[Point]:
    grid = suite.grid
    server_axis = _axis(grid.server.model_dump())
    load_axis = _axis(grid.load.model_dump())
    points = []
    for target in sorted(suite.targets, key=TARGET_ORDER.index):
        stages = STAGES[target]
        archive_values = {
            "batch_size": grid.archive.batch_size,
            "max_batch_delay_ms": grid.archive.max_batch_delay_ms,
            "micro_batch_size": grid.archive.micro_batch_size,
            "overlap": grid.archive.overlap,
            "decode_threads": grid.archive.decode_threads,
        }
        if "seg" in stages:
            archive_values["precision"] = grid.archive.precision
            archive_values["input_size"] = grid.archive.input_size
        if "jpeg" in stages:
            archive_values["jpeg_quality"] = grid.archive.jpeg_quality
        for server, archive, runtime, load in itertools.product(
            server_axis, _axis(archive_values), _runtime_axis(suite, target), load_axis
        ):
            points.append(Point(target, server, archive, runtime, load))
    # Cheapest order: server settings outermost, then target, archive, runtime, load.
    return sorted(points, key=lambda p: (repr(p.server), TARGET_ORDER.index(p.target), repr(p.archive), repr(p.runtime), repr(p.load)))


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
        if previous is None or point.server != previous.server:
            restarts += 1
            registrations += 1
        elif (point.target, point.archive) != (previous.target, previous.archive):
            registrations += 1
        elif point.runtime != previous.runtime:
            scales += 1
        previous = point
    load = suite.load
    fixed_s = restarts * RESTART_S + registrations * REGISTER_S + scales * SCALE_S + len(points) * load.warmup_s
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
