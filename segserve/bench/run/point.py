"""One point, one place: a point of the plan resolved once (its target's weights node, that node's handler settings,
the network it runs) and measured: deployed, loaded, made a record. What a run measures beside a point (the bare
forward, the accuracy gate, the autoscaler: baselines.py) joins it through hooks, as callbacks join a LitServe
server's requests or Model Analyzer's perf measurement; the runner's loop and `bench ab` both measure with it."""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from segserve.archives.build import node_handler_settings
from segserve.archives.catalog import Catalog
from segserve.bench.run.bare_forward import bare_device
from segserve.bench.run.measure import measure, measure_phases
from segserve.bench.suite.columns import Record
from segserve.bench.suite.plan import Point, settings_for
from segserve.bench.suite.spec import LoadSettings


@dataclass(frozen=True)
class ResolvedPoint:
    """A point with what measuring it needs of its target, worked out once."""

    point: Point
    weights_node: str | None = None  # the node carrying segserve's weights (seg), in any target
    handler: dict = field(default_factory=dict)  # that node's handler settings ({} without one)
    variant: dict | None = None  # the network it runs: {optimize, precision, backbone, input size, program, device}
    python: str | None = None  # the Python its server runs (a venv's); None: this one
    bare_node: str | None = None  # a model target that runs its network: the bare forward is measured beside it

    @property
    def target(self) -> str:
        return self.point.target

    @property
    def params(self) -> dict:
        return self.point.params


def resolve(point: Point, catalog: Catalog, recipe=None) -> ResolvedPoint:
    """The point's weights node, handler settings and network; `recipe` (the deployment's archive builder) names
    an int8 network's program, quantised once per recipe: without one the variant has no program."""
    target = catalog.targets.get(point.target)
    node = target.weights_node if target else None
    if node is None:
        return ResolvedPoint(point)
    node_settings, _, _ = settings_for(point, target)
    handler = node_handler_settings(node.model, node_settings.get(node.name, {}))
    variant, python = network_variant(handler, point.params, node.model, recipe)
    # skip_network (the serving path alone) runs no network: no bare forward to hold it against
    bare_node = node.name if target.is_model and not handler.get("skip_network") else None
    return ResolvedPoint(point, node.name, handler, variant, python, bare_node)


def network_variant(handler: dict, params: dict, model=None, recipe=None) -> tuple[dict, str | None]:
    """(the network a weights node's handler settings run, the Python of the point's venv or None)."""
    variant = {k: handler.get(k) for k in ("optimize", "precision", "backbone", "input_height", "input_width")}
    if handler.get("optimize") == "int8" and recipe is not None:
        try:  # quantised once per recipe: the deploy's archive carries the same file
            variant["program"] = recipe.serialized_file(model, handler)
        except Exception:  # the deploy quantises it again and fails the point with the reason (no hook runs)
            variant["program"] = None
    variant["device"] = bare_device(handler.get("device"))
    venv = params.get("venv")
    return variant, str(Path(venv) / "bin" / "python") if venv else None


class Hook(Protocol):
    """What a run measures beside a point, joined to its measurement."""

    def start(self, point: ResolvedPoint) -> None:
        """The point is deployed, its load about to start."""

    def finish(self, point: ResolvedPoint, metrics: dict | None) -> dict:
        """Its load ended (`metrics` None: it raised); the keys this adds to the point's record."""


class PointMeasurement:
    """Measures resolved points on a deployment: deploy, the hooks' start, the load, the hooks' finish, a record.
    `bodies_for(target[, phase])` gives request bodies; `pruner_for(point)` a search's pruner or None."""

    def __init__(self, deployment, load: LoadSettings, bodies_for, hooks: tuple = (), pruner_for=None):
        self.deployment, self.load, self.bodies_for, self.hooks = deployment, load, bodies_for, tuple(hooks)
        self.pruner_for = pruner_for or (lambda _point: None)

    def measure(self, point: ResolvedPoint) -> Record:
        started = time.monotonic()
        metrics = error = reconfigure_s = cause = left_out = None
        added: dict = {}
        try:
            left_out = self.bodies_before_deploy(point.target)
            started = time.monotonic()  # a capture is not the point's reconfiguration
            endpoint = self.deployment.deploy(point.point)
            reconfigure_s = time.monotonic() - started
            server, log_mark = self.worker_log_mark()
            joined: list[Hook] = []
            try:
                for hook in self.hooks:
                    hook.start(point)
                    joined.append(hook)
                metrics = self.measure_load(point, endpoint)
            finally:  # the last joined first: the autoscaler stops before the bare forward's slice after the load
                for hook in reversed(joined):
                    added.update(hook.finish(point, metrics))
            if metrics["requests_failed"] and server is not None:  # why they failed: the workers' first exception
                cause = server.worker_exception(log_mark, wait_s=1.0)
            if not metrics["requests_ok"]:  # kept with its counts, but 0 req/s would read as a slow point
                error = no_request_completed(metrics, cause)
                metrics["throughput_rps"] = None
                self.deployment.stop_servers()  # a wedged worker: start clean for the next point
        except Exception as failure:  # one failed point must not lose the others (an optimisation that fails too)
            reconfigure_s = time.monotonic() - started if reconfigure_s is None else reconfigure_s
            error = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
            cause = getattr(failure, "cause", None)  # a worker that did not load: its root cause (management.py)
            self.deployment.stop_servers()  # start clean for the next point
        record = record_for(point.point, reconfigure_s, metrics, error, point.weights_node)
        overrides = self.deployment.archive_overrides  # which values of a .war's spec its copy changed
        record.update({"load_s": self.deployment.load_s, "error_cause": cause, "archive_overrides": overrides, **added})
        if left_out:  # a workflow member: the inputs a node above it failed, which it never gets in the workflow
            record["inputs_left_out"] = left_out
        if point.weights_node:  # where the end-of-suite bare forward runs (its handler's `device`)
            record["weights_device"] = point.handler.get("device") or "auto"
        record.update(validity(record))
        return record

    def bodies_before_deploy(self, target: str) -> str | None:
        """A workflow member's inputs are what the workflow's DAG sends it: its model nodes' answers captured (once)
        by registering each alone on the server, before the point registers its own target, which a capture would
        release. Returns the inputs it never gets in the workflow (suite_inputs.MemberBodies), None for others."""
        phases = [p.name for p in self.load.phases or []]
        # called as measure_load calls it: the same cache entries
        bodies = [self.bodies_for(target, phase) for phase in phases] or [self.bodies_for(target)]
        return "; ".join(dict.fromkeys(b.left_out for b in bodies if getattr(b, "left_out", None))) or None

    def worker_log_mark(self) -> tuple:
        """(the bench's TorchServe when it serves the point, the size of its workers' log now): where the point's
        own log starts; (None, 0) for a target that is not served by it."""
        torchserve = self.deployment.torchserve
        if self.deployment.active is not torchserve or torchserve.torchserve_logs is None:  # none, or Ray's
            return None, 0
        return torchserve.server, torchserve.server.model_log_size()

    def measure_load(self, point: ResolvedPoint, endpoint) -> dict:
        """Under the suite's load: its phases one after the other, or windows until it settles."""
        load, fresh = self.load, self.deployment.fresh_workers
        groups = self.deployment.watched_processes(endpoint)
        if load.phases:
            bodies = {phase.name: self.bodies_for(point.target, phase.name) for phase in load.phases}
            return measure_phases(endpoint, load, point.params, bodies, groups, fresh)
        prune = self.pruner_for(point.point)
        return measure(endpoint, load, point.params, self.bodies_for(point.target), groups, fresh, prune)


def no_request_completed(metrics: dict, cause: str | None = None) -> str:
    """Why a point whose measured load completed nothing has no throughput: 0 req/s would read as a slow point;
    the workers' first exception (`cause`) first."""
    failed = metrics["requests_failed"]
    statuses = ", ".join(f"{status}: {count}" for status, count in sorted(metrics["failures_by_status"].items()))
    what = f"{failed} failed ({statuses})" if failed else "none answered"
    # a stall that emptied the windows says why none completed there (the requests before it were answered)
    first = "".join(f"{reason}; " for reason in (cause, metrics.get("stall_cause")) if reason)
    return f"RuntimeFailure: {first}no request completed in {metrics['duration_s']:.1f} s of measured load: {what}"


def validity(record: dict) -> dict:
    """A point is valid when it was measured and its network passed the accuracy gate; else the reason."""
    if record.get("error"):
        return {"valid": False, "invalid_reason": record["error"]}
    if record.get("accurate") is False:
        return {"valid": False, "invalid_reason": record.get("invalid_reason")}
    return {"valid": True, "invalid_reason": None}


def record_for(point: Point, reconfigure_s: float, metrics: dict | None, error: str | None, weights_node: str | None = None) -> Record:
    """The flat record of a point: the design's columns first, every parameter, the metrics. `workers` is the
    node carrying the weights (seg) where a target scales nodes apart, else its one count."""
    params, workers = point.params, point.workers
    return {  # type: ignore[typeddict-item]  (its parameters and metrics beside the declared keys)
        "run_id": point.run_id,
        "target": point.target,
        "engine": point.engine,
        "workers": workers.get(weights_node) or next(iter(workers.values()), None),
        "batch_size": params.get("batch_size"),
        "max_batch_delay_ms": params.get("max_batch_delay_ms"),
        "concurrency": params.get("concurrency"),
        "request_rate_rps": params.get("request_rate_rps"),
        **params,
        **(metrics or {}),
        "reconfigure_s": round(reconfigure_s, 3),
        "error": error,
        "point_key": point.key,
    }
