"""The bench's loop: the strategy proposes a point, the deployment puts it in place, it is measured, made a
record, handed to every sink, and the strategy is told. The runner knows none of them by name."""

import json
import statistics
import time
from pathlib import Path

from segserve.archives.build import node_handler_settings
from segserve.archives.catalog import Catalog
from segserve.autoscale.loop import Autoscaler, InBackground, dag_bounds, reactions
from segserve.autoscale.rules import Policy
from segserve.bench.results.stats import ratio_of_medians
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.measure import bare_shape, measure, measure_phases, process_groups, run_accuracy, run_bare
from segserve.bench.search import Strategy
from segserve.bench.suite.plan import Point, settings_for
from segserve.errors import RuntimeFailure
from segserve.model.accuracy import verdict


class Runner:
    def __init__(self, catalog: Catalog, deployment: Deployment, strategy: Strategy, sinks: list, bodies_for, log=print):
        self.catalog, self.deployment, self.strategy, self.sinks = catalog, deployment, strategy, sinks
        self.bodies_for, self.log = bodies_for, log  # bodies_for(target name) → request bodies
        self.suite = deployment.suite
        self.scores: dict[str, dict] = {}  # accuracy of each network variant, scored once per suite

    def run(self, done: dict[str, dict], base: dict) -> list[dict]:
        """Measure what the strategy proposes; `done`: records of an earlier run of the same folder (a point
        measured without error is kept: its run id says it was measured the same way). `base`: keys every
        record carries (environment, setup)."""
        records = []
        kept = sum(1 for p in self.strategy.plan() if not done.get(p.run_id, {}).get("error", True))
        progress = Progress(self.strategy.size() - kept, self.log)
        try:
            while (point := self.strategy.ask()) is not None:
                record = done.get(point.run_id)
                if record is None or record.get("error"):
                    started = time.monotonic()
                    notes = self.strategy.annotate(point) if hasattr(self.strategy, "annotate") else {}
                    record = {**self.measure_point(point), **base(point), **notes}
                    for sink in self.sinks:
                        sink.add(record)
                    progress.step(point, record, time.monotonic() - started)
                self.strategy.tell(point, record)
                records.append(record)
        finally:
            self.deployment.close()
            if hasattr(self.strategy, "close"):
                self.strategy.close()
        return records

    def measure_point(self, point: Point) -> dict:
        started = time.monotonic()
        metrics = error = None
        node = self.weights_node(point.target)
        slices: list[float] = []
        try:
            endpoint = self.deployment.deploy(point)
            reconfigure_s = time.monotonic() - started
            accuracy = self.accuracy(point)
            server = self.deployment.server if endpoint.metrics_url else None
            groups = process_groups(server, endpoint.models) if server else None
            # the bare forward in short slices before and after the point: the same spell of the shared machine
            slices += self.bare_slices(point, node)
            metrics = self.measure_load(point, endpoint, groups)
            slices += self.bare_slices(point, node)
        except Exception as failure:  # one failed point must not lose the others (an optimisation that fails too)
            reconfigure_s = time.monotonic() - started
            accuracy = {}
            error = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
            self.deployment.stop_server()  # start clean for the next point
        record = record_for(point, reconfigure_s, metrics, error, self.weights_node(point.target, alone=False))
        record.update({"load_s": self.deployment.load_s, **accuracy})
        record.update(validity(record))
        if node and not error:
            record.update(served_vs_bare(record.get("measured_window_throughputs_rps") or [], slices))
        return record

    def measure_load(self, point: Point, endpoint, groups: dict | None) -> dict:
        """Under the suite's load (its phases one after the other, or windows until it settles), with the
        autoscaler running beside it for an autoscaled point."""
        load, fresh = self.suite.load, self.deployment.fresh_workers
        scaler = self.autoscaler(point).start() if point.autoscaled else None
        try:
            if load.phases:
                bodies = {phase.name: self.bodies_for(point.target, phase.name) for phase in load.phases}
                metrics = measure_phases(endpoint, load, point.params, bodies, groups, fresh)
            else:
                prune = self.strategy.pruner_for(point) if hasattr(self.strategy, "pruner_for") else None
                metrics = measure(endpoint, load, point.params, self.bodies_for(point.target), groups, fresh, prune)
        finally:
            scaled = scaler.stop() if scaler else {}
            if scaler:
                self.deployment.current_workers = {}  # it moved workers: the next point scales every node to its own
        if scaled:
            metrics.update(scaled)
            phases = metrics.get("phases", [])
            for phase, reaction in zip(phases, reactions(phases, scaled["autoscale_decisions"]), strict=True):
                phase.update(reaction)
        return metrics

    def autoscaler(self, point: Point) -> InBackground:
        """segserve autoscale's loop for this point's workflow: its workers' total is the budget, its DAG's YAML
        gives each node's min/max."""
        settings = self.suite.autoscaler
        policy = Policy(sum(point.workers.values()), settings.hysteresis, settings.min_interval_s, settings.min_queue_ms)
        server = self.deployment.server
        # its decisions go to the run dir's autoscale.jsonl and the record; the progress line counts its moves
        scaler = Autoscaler(server, dag_bounds(self.catalog, point.target), policy, server.run_dir, log=lambda _line: None)
        return InBackground(scaler, settings.interval_s)

    def bare_slices(self, point: Point, node: str | None) -> list[float]:
        if node is None:
            return []
        threads, shape = bare_shape(point.params, node)
        variant, python = self.variant(point)
        env = self.deployment.compile_env
        entries = run_bare(
            self.deployment.weights, threads, [shape], seconds=1.5, rounds=3, log=self.log, variant=variant, python=python, env=env
        )
        return entries[0]["slices_ips"] if entries else []

    def variant(self, point: Point) -> tuple[dict | None, str | None]:
        """The network the point's weights node runs ({optimize, precision, input size, backbone, program}) and
        the Python its server runs (a venv's); (None, None) for a target without weights."""
        target = self.catalog.targets.get(point.target)
        node = next((n for n in target.nodes if n.model.weights), None) if target else None
        if node is None:
            return None, None
        node_settings, _, _ = settings_for(point, target)
        handler = node_handler_settings(node.model, node_settings.get(node.name, {}))
        variant = {k: handler.get(k) for k in ("optimize", "precision", "backbone", "input_height", "input_width")}
        if handler.get("optimize") == "int8":
            variant["program"] = self.deployment.recipe.serialized_file(node.model, handler)
        venv = point.params.get("venv")
        return variant, str(Path(venv) / "bin" / "python") if venv else None

    def accuracy(self, point: Point) -> dict:
        """{iou, iou_eager, agreement, valid, invalid_reason} of the point's network against eager fp32, scored
        once per variant; {} for eager fp32 itself and for targets without weights."""
        variant, python = self.variant(point)
        if variant is None or (variant.get("optimize") or "eager", variant.get("precision") or "fp32") == ("eager", "fp32"):
            return {}
        key = json.dumps([variant, python], sort_keys=True, default=str)
        if key not in self.scores:
            threads, _ = bare_shape(point.params, self.weights_node(point.target, alone=False))
            try:
                scores = run_accuracy(self.deployment.weights, threads, variant, python, env=self.deployment.compile_env)
                valid, reason = verdict(scores)
                self.scores[key] = {k: scores[k] for k in ("iou", "iou_eager", "agreement")} | {"accurate": valid, "invalid_reason": reason}
            except RuntimeFailure as failure:
                self.scores[key] = {"accurate": False, "invalid_reason": str(failure)}
            self.log(f"accuracy of {variant.get('optimize')}/{variant.get('precision')}: {self.scores[key]}")
        return self.scores[key]

    def weights_node(self, name: str, alone: bool = True) -> str | None:
        """The node of a target that carries the weights (seg); `alone`: only for a model target, the one whose
        points get the bare forward measured beside them."""
        target = self.catalog.targets.get(name)
        if target is None or (alone and target.kind != "model"):
            return None
        return next((node.name for node in target.nodes if node.model.weights), None)


def validity(record: dict) -> dict:
    """A point is valid when it was measured and its network passed the accuracy gate; else the reason."""
    if record.get("error"):
        return {"valid": False, "invalid_reason": record["error"]}
    if record.get("accurate") is False:
        return {"valid": False, "invalid_reason": record.get("invalid_reason")}
    return {"valid": True, "invalid_reason": None}


def served_vs_bare(served_windows_rps: list[float], bare_slices_ips: list[float]) -> dict:
    """served ÷ bare as the ratio of medians (windows over slices) with its bootstrap interval; a ratio whose
    whole interval is above 1 (served faster than the bare network) makes no physical sense: `suspect`."""
    value, interval = ratio_of_medians(served_windows_rps, bare_slices_ips)
    return {
        "bare_forward_ips": statistics.median(bare_slices_ips) if bare_slices_ips else None,
        "bare_slices_ips": bare_slices_ips,
        "ratio_bare": value,
        "ratio_bare_ci_low": interval[0] if interval else None,
        "ratio_bare_ci_high": interval[1] if interval else None,
        "suspect": bool(interval and interval[0] > 1.0),
    }


def record_for(point: Point, reconfigure_s: float, metrics: dict | None, error: str | None, weights_node: str | None = None) -> dict:
    """The flat record of a point: the design's columns first, every parameter, the metrics. `workers` is the
    node carrying the weights (seg) where a target scales nodes apart, else its one count."""
    params, workers = point.params, point.workers
    return {
        "run_id": point.run_id,
        "target": point.target,
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


def bare_throughputs(records: list[dict], weights: Path, weights_node, log=print) -> list[dict]:
    """The bare forward throughput for every (batch size, threads, input size) the weights' node ran with.

    One process per thread count measures its shapes round-robin (segserve/model/bare.py)."""
    shapes_by_threads: dict[int, set] = {}
    for record in records:
        node = weights_node(record["target"], alone=False)
        if node:
            threads, shape = bare_shape(record, node)
            shapes_by_threads.setdefault(threads, set()).add(shape)
    if shapes_by_threads:
        log("measuring the bare model's forward throughput (the compute limit) …")
    return [entry for threads, shapes in sorted(shapes_by_threads.items()) for entry in run_bare(weights, threads, sorted(shapes), log=log)]


class Progress:
    """One line per finished point, with a bar and an ETA from the mean time per point so far."""

    def __init__(self, total: int, log):
        self.total, self.log, self.done, self.started = max(total, 1), log, 0, time.monotonic()

    def step(self, point: Point, record: dict, elapsed_s: float) -> None:
        self.done += 1
        eta_s = (time.monotonic() - self.started) / self.done * max(self.total - self.done, 0)
        bar = "#" * min(20, round(20 * self.done / self.total))
        params = " ".join(f"{k}={v}" for k, v in point.params.items())
        if record["error"]:
            outcome = f"FAILED {record['error']}"
        else:
            outcome = f"{record['throughput_rps']:.1f} req/s, p99 {record['latency_p99_ms'] or float('nan'):.0f} ms"
            if record.get("autoscale"):
                outcome += f", the autoscaler moved {record.get('autoscaler_moves')} worker(s)"
                outcome += f" (it died: {record['autoscaler_failure']})" if record.get("autoscaler_failure") else ""
            if record.get("pruned"):
                outcome += f", pruned after {record['windows']} window(s) (hopeless)"
            if record.get("windows_discarded"):
                outcome += f", {record['windows_discarded']} disturbed window(s) measured again"
            if record.get("disturbed"):
                outcome += f", DISTURBED (others took {record.get('others_cpu_pct') or 0:.0f}% of the machine)"
        self.log(f"[{bar:<20}] {self.done}/{self.total} {point.target} {params}: {outcome} ({elapsed_s:.0f}s; ETA {eta_s / 60:.1f} min)")
