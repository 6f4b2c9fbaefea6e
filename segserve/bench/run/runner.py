"""The bench's loop: the strategy proposes a point, the deployment puts it in place, it is measured, made a
record, handed to every sink, and the strategy is told. The runner knows none of them by name."""

import json
import statistics
import time
from pathlib import Path

import numpy as np

from segserve.archives.build import node_handler_settings
from segserve.archives.catalog import Catalog
from segserve.autoscale.loop import Autoscaler, InBackground, reactions, target_bounds
from segserve.autoscale.rules import Policy
from segserve.bench.results.analysis import bare_ratio_reasons
from segserve.bench.results.stats import bootstrap_interval, ratio_of_medians, uncertainty
from segserve.bench.run.bare_forward import bare_device, bare_shape, run_accuracy, run_bare
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.failures import failure_line, merged
from segserve.bench.run.measure import measure, measure_phases
from segserve.bench.run.stalls import stall_cause
from segserve.bench.search import Strategy
from segserve.bench.suite.columns import Record
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
                    notes = self.strategy.annotate(point)
                    record = {**self.measure_point(point), **base(point), **notes}
                    for sink in self.sinks:
                        sink.add(record)
                    progress.step(point, record, time.monotonic() - started)
                self.strategy.tell(point, record)
                records.append(record)
        finally:
            self.strategy.close()
        return records

    def run_rounds(self, rounds: int, base) -> list[dict]:
        """Every point of the plan `rounds` times: the order reversed every other round (A B C, C B A, …) and every
        model registered afresh each round (a registration's workers keep their luck: ±10% on 2 cores), so that a
        slow spell or a lucky worker is one round's noise. One record per point (combine_rounds) to every sink."""
        points = self.strategy.plan()
        measured: dict[str, list[dict]] = {point.run_id: [] for point in points}
        progress = Progress(len(points) * rounds, self.log)
        records = []
        try:
            this_round = 0
            for index, point, _ in round_schedule(points, rounds):
                if index != this_round:
                    self.deployment.release()  # fresh workers for the next round
                    this_round = index
                started = time.monotonic()
                measured[point.run_id].append(self.measure_point(point))
                progress.step(point, measured[point.run_id][-1], time.monotonic() - started)
        finally:
            # also when stopped part-way: what was measured reaches runs/ and the summary, `rounds` says how much
            for point in (p for p in points if measured[p.run_id]):
                record = {**combine_rounds(measured[point.run_id]), **base(point)}
                for sink in self.sinks:
                    sink.add(record)
                records.append(record)
        return records

    def measure_point(self, point: Point) -> dict:
        started = time.monotonic()
        metrics = error = reconfigure_s = cause = left_out = None
        # skip_network (the serving path alone) runs no network: no bare forward to hold it against
        runs_network = not self.handler_settings(point).get("skip_network")
        node = self.weights_node(point.target) if runs_network else None
        slices: list[dict] = []  # the bare forward's entries before and after the point
        weights_device = None  # the weights node's handler `device`: where the end-of-suite bare forward runs
        try:
            if self.weights_node(point.target, alone=False):
                weights_device = self.handler_settings(point).get("device") or "auto"
            left_out = self.bodies_before_deploy(point)
            started = time.monotonic()  # a capture is not the point's reconfiguration
            endpoint = self.deployment.deploy(point)
            reconfigure_s = time.monotonic() - started
            accuracy = self.accuracy(point)
            groups = self.deployment.watched_processes(endpoint)
            # the bare forward in short slices before and after the point: the same spell of the shared machine
            slices += self.bare_slices(point, node)
            server, log_mark = self.worker_log_mark()
            metrics = self.measure_load(point, endpoint, groups)
            slices += self.bare_slices(point, node)
            if metrics["requests_failed"] and server is not None:  # why they failed: the workers' first exception
                cause = server.worker_exception(log_mark, wait_s=1.0)
            metrics["stall_cause"] = stall_cause(metrics.get("stalls"), metrics.get("failures"), self.suite.load.timeout_s)
            if not metrics["requests_ok"]:  # kept with its counts, but 0 req/s would read as a slow point
                error = no_request_completed(metrics, cause)
                metrics["throughput_rps"] = None
                self.deployment.stop_servers()  # a wedged worker: start clean for the next point
        except Exception as failure:  # one failed point must not lose the others (an optimisation that fails too)
            reconfigure_s = time.monotonic() - started if reconfigure_s is None else reconfigure_s
            accuracy = {}
            error = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
            cause = getattr(failure, "cause", None)  # a worker that did not load: its root cause (management.py)
            self.deployment.stop_servers()  # start clean for the next point
        record = record_for(point, reconfigure_s, metrics, error, self.weights_node(point.target, alone=False))
        record.update({"load_s": self.deployment.load_s, "error_cause": cause, **accuracy})
        if left_out:  # a workflow member: the inputs a node above it failed, which it never gets in the workflow
            record["inputs_left_out"] = left_out
        record.update(validity(record))
        if weights_device:
            record["weights_device"] = weights_device
        if node and not error:
            record.update(served_vs_bare(record.get("measured_window_throughputs_rps") or [], slices))
            record["bare_device"] = next((entry.get("device") for entry in slices), None)
            record.update(ratio_judgement(record))
        return record

    def worker_log_mark(self) -> tuple:
        """(the bench's TorchServe when it serves the point, the size of its workers' log now): where the point's
        own log starts; (None, 0) for a target that is not served by it."""
        deployment = self.deployment
        if getattr(deployment, "active", None) is not getattr(deployment, "torchserve", None) or deployment.server is None:
            return None, 0
        return deployment.server, deployment.server.model_log_size()

    def bodies_before_deploy(self, point: Point) -> str | None:
        """A workflow member's inputs are what the workflow's DAG sends it: its model nodes' answers captured (once)
        by registering each alone on the server, before the point registers its own target, which a capture would
        release. Returns the inputs it never gets in the workflow (suite_inputs.MemberBodies), None for others."""
        phases = [p.name for p in self.suite.load.phases or []]
        # called as measure_load calls it: the same cache entries
        bodies = [self.bodies_for(point.target, phase) for phase in phases] or [self.bodies_for(point.target)]
        return "; ".join(dict.fromkeys(b.left_out for b in bodies if getattr(b, "left_out", None))) or None

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
                prune = self.strategy.pruner_for(point)
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
        (an archive target: its .war's spec) gives each node's min/max."""
        settings = self.suite.autoscaler
        policy = Policy(sum(point.workers.values()), settings.hysteresis, settings.min_interval_s, settings.min_queue_ms)
        server = self.deployment.server
        # its decisions go to the run dir's autoscale.jsonl and the record; the progress line counts its moves
        scaler = Autoscaler(server, target_bounds(self.catalog, point.target), policy, server.run_dir, log=lambda _line: None)
        return InBackground(scaler, settings.interval_s)

    def bare_slices(self, point: Point, node: str | None) -> list[dict]:
        """The bare forward's entry at the point's shape, on the device its workers use, watched for others as
        the point's windows are."""
        if node is None:
            return []
        threads, shape = bare_shape(point.params, node)
        variant, python = self.variant(point)
        load = self.suite.load
        entries = run_bare(
            self.deployment.weights, threads, [shape], seconds=load.bare_forward_s / 4, rounds=3, log=self.log, variant=variant,
            python=python, env=self.deployment.compile_env, max_others_share=load.max_others_share, retries=load.max_windows,
        )  # fmt: skip
        return entries[:1]

    def variant(self, point: Point) -> tuple[dict | None, str | None]:
        """The network the point's weights node runs ({optimize, precision, input size, backbone, program, device})
        and the Python its server runs (a venv's); (None, None) for a target without weights."""
        target = self.catalog.targets.get(point.target)
        node = next((n for n in target.nodes if n.model.weights), None) if target else None
        if node is None:
            return None, None
        handler = self.handler_settings(point)
        variant = {k: handler.get(k) for k in ("optimize", "precision", "backbone", "input_height", "input_width")}
        if handler.get("optimize") == "int8":
            variant["program"] = self.deployment.recipe.serialized_file(node.model, handler)
        variant["device"] = bare_device(handler.get("device"))
        venv = point.params.get("venv")
        return variant, str(Path(venv) / "bin" / "python") if venv else None

    def handler_settings(self, point: Point) -> dict:
        """The handler settings of the point's weights node ({} for a target without weights)."""
        target = self.catalog.targets.get(point.target)
        node = next((n for n in target.nodes if n.model.weights), None) if target else None
        if node is None:
            return {}
        node_settings, _, _ = settings_for(point, target)
        return node_handler_settings(node.model, node_settings.get(node.name, {}))

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
        if target is None or (alone and not target.is_model):
            return None
        return next((node.name for node in target.nodes if node.model.weights), None)


def round_schedule(points: list, rounds: int, sides: tuple = (None,)):
    """(round, point, side) in the order they are measured: the points' order reversed every other round (A B C,
    C B A, …) so that no point always comes first or last, and with two sides (`bench ab`'s versions) each point's
    sides in turn, the other one first at each next point (a b, b a, …): a point's order flips between rounds too."""
    slot = 0  # the (round, point) pairs in measuring order: the first side alternates between them
    for index in range(rounds):
        for point in points if index % 2 == 0 else points[::-1]:
            for side in sides if slot % 2 == 0 else sides[::-1]:
                yield index, point, side
            slot += 1


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


def served_vs_bare(served_windows_rps: list[float], bare_entries: list[dict]) -> dict:
    """served ÷ bare as the ratio of medians (windows over the bare forward's slices before and after the point)
    with its bootstrap interval; a ratio whose whole interval is above 1 (served faster than the bare network)
    makes no physical sense: `suspect`. `bare_disturbed`: others used the machine during the bare forward."""
    slices = [rate for entry in bare_entries for rate in entry.get("slices_ips", [])]
    value, interval = ratio_of_medians(served_windows_rps, slices)
    shares = [share for entry in bare_entries for share in entry.get("slices_others_cpu_pct", [])]
    return {
        "bare_forward_ips": statistics.median(slices) if slices else None,
        "bare_slices_ips": slices,
        "bare_disturbed": any(entry.get("disturbed") for entry in bare_entries),
        "bare_others_cpu_pct": max(shares, default=None),
        "bare_slices_discarded": sum(entry.get("slices_discarded", 0) for entry in bare_entries),
        "ratio_bare": value,
        "ratio_bare_ci_low": interval[0] if interval else None,
        "ratio_bare_ci_high": interval[1] if interval else None,
        "suspect": bool(interval and interval[0] > 1.0),
    }


def ratio_judgement(record: dict) -> dict:
    """{"ratio_bare_uncertain": None, or why the record's served ÷ bare is not a number to print}."""
    value, low, high = record.get("ratio_bare"), record.get("ratio_bare_ci_low"), record.get("ratio_bare_ci_high")
    return {"ratio_bare_uncertain": uncertainty(value, (low, high) if low is not None else None, bare_ratio_reasons(record))}


def combine_rounds(rounds: list[dict]) -> dict:
    """One record of a point measured in rounds: throughput the median of the rounds' with a bootstrap interval
    of that median, p50/p99 the medians of the rounds', the windows and bare slices of every round pooled for the
    ratios (their intervals then hold the rounds' spread), flags set when any round's is; a failed round fails
    the point with its error."""
    failed = next((r for r in rounds if r.get("error")), None)
    rates = [r["throughput_rps"] for r in rounds if not r.get("error")]
    if failed is not None:
        return {**failed, "rounds": len(rounds), "rounds_throughput_rps": rates}
    record = dict(rounds[-1])
    interval = bootstrap_interval([rates], np.median)
    record.update(
        {
            "rounds": len(rounds),
            "rounds_throughput_rps": rates,
            "throughput_rps": statistics.median(rates),
            "throughput_ci_low_rps": interval[0] if interval else None,
            "throughput_ci_high_rps": interval[1] if interval else None,
            "rounds_latency_p99_ms": [r.get("latency_p99_ms") for r in rounds],
            "measured_window_throughputs_rps": [w for r in rounds for w in r.get("measured_window_throughputs_rps") or []],
            "requests_ok": sum(r.get("requests_ok") or 0 for r in rounds),
            "requests_failed": sum(r.get("requests_failed") or 0 for r in rounds),
            "failures": merged([r.get("failures") for r in rounds]),
        }
    )
    for key in ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_mean_ms"):
        values = [r[key] for r in rounds if r.get(key) is not None]
        record[key] = statistics.median(values) if values else None
    for flag in ("disturbed", "bare_disturbed", "suspect", "client_saturated", "stalled"):
        values = [r.get(flag) for r in rounds]  # None in every round: not watched (an http target), not clean
        record[flag] = None if all(v is None for v in values) else any(values)
    record["stable"] = all(r.get("stable") is not False for r in rounds)
    record["stalled_s"] = sum(r.get("stalled_s") or 0 for r in rounds)
    record["stall_cause"] = "; ".join(r["stall_cause"] for r in rounds if r.get("stall_cause")) or None
    record["others_cpu_pct"] = max((r["others_cpu_pct"] for r in rounds if r.get("others_cpu_pct") is not None), default=None)
    if any(r.get("bare_slices_ips") for r in rounds):
        entries = [{"slices_ips": r.get("bare_slices_ips") or [], "disturbed": r.get("bare_disturbed")} for r in rounds]
        record.update(served_vs_bare(record["measured_window_throughputs_rps"], entries))
        record["bare_disturbed"] = any(r.get("bare_disturbed") for r in rounds)
        record["bare_slices_discarded"] = sum(r.get("bare_slices_discarded") or 0 for r in rounds)
        record["suspect"] = record["suspect"] or any(r.get("suspect") for r in rounds)
        record["bare_others_cpu_pct"] = max(
            (r["bare_others_cpu_pct"] for r in rounds if r.get("bare_others_cpu_pct") is not None), default=None
        )
        record.update(ratio_judgement(record))
    return record


def record_for(point: Point, reconfigure_s: float, metrics: dict | None, error: str | None, weights_node: str | None = None) -> Record:
    """The flat record of a point: the design's columns first, every parameter, the metrics. `workers` is the
    node carrying the weights (seg) where a target scales nodes apart, else its one count."""
    params, workers = point.params, point.workers
    return {  # type: ignore[typeddict-item]  (its parameters and metrics beside the declared keys)
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


def bare_throughputs(records: list[dict], weights: Path, weights_node, log=print, load=None) -> list[dict]:
    """The bare forward throughput for every (batch size, threads, input size) the weights' node ran with, on
    the device it ran on (the record's `weights_device`: its handler setting).

    One process per thread count and device measures its shapes round-robin (segserve/model/bare.py), watched
    for others as the suite's windows are (`load`: its max_others_share and max_windows)."""
    watch = {"max_others_share": load.max_others_share, "retries": load.max_windows, "seconds": load.bare_forward_s} if load else {}
    shapes_by_run: dict[tuple[int, str], set] = {}
    for record in records:
        node = weights_node(record["target"], alone=False)
        if node and not record.get("skip_network"):
            threads, shape = bare_shape(record, node)
            shapes_by_run.setdefault((threads, bare_device(record.get("weights_device"))), set()).add(shape)
    if shapes_by_run:
        log("measuring the bare model's forward throughput (the compute limit) …")
    return [
        entry
        for (threads, device), shapes in sorted(shapes_by_run.items())
        for entry in run_bare(weights, threads, sorted(shapes), log=log, variant={"device": device}, **watch)
    ]


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
            if record.get("error_cause"):
                outcome += f", {record.get('requests_failed')} failed: {record['error_cause']}"
            if record.get("autoscale"):
                outcome += f", the autoscaler moved {record.get('autoscaler_moves')} worker(s)"
                outcome += f" (it died: {record['autoscaler_failure']})" if record.get("autoscaler_failure") else ""
            if record.get("pruned"):
                outcome += f", pruned after {record['windows']} window(s) (hopeless)"
            if record.get("windows_discarded"):
                outcome += f", {record['windows_discarded']} disturbed window(s) measured again"
            if record.get("stall_cause"):  # the server's own: a drop it explains is not others' doing
                outcome += f", STALLED ({record['stall_cause']})"
            if record.get("disturbed"):
                outcome += f", DISTURBED (others took {record.get('others_cpu_pct') or 0:.0f}% of the machine)"
            if record.get("bare_disturbed"):
                outcome += f", its bare forward DISTURBED (others took {record.get('bare_others_cpu_pct') or 0:.0f}% of the machine)"
        self.log(f"[{bar:<20}] {self.done}/{self.total} {point.target} {params}: {outcome} ({elapsed_s:.0f}s; ETA {eta_s / 60:.1f} min)")
        if line := failure_line(point.run_id, record.get("failures")):
            self.log(line)
