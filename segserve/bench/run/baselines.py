"""What a run measures beside its points, each a hook of the point's measurement (point.py): the bare forward in
short slices before and after a point's load, the accuracy gate of an optimised network, and the autoscaler
running beside an autoscaled point's load. And the bare forward at the suite's end, for every shape that ran."""

import json
import statistics
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.autoscale.loop import Autoscaler, InBackground, reactions, target_bounds
from segserve.autoscale.rules import Policy
from segserve.bench.results.analysis import bare_ratio_reasons
from segserve.bench.results.stats import ratio_of_medians, uncertainty
from segserve.bench.run.bare_forward import bare_device, bare_shape, run_accuracy, run_bare
from segserve.bench.run.point import ResolvedPoint
from segserve.bench.suite.spec import Suite
from segserve.errors import RuntimeFailure
from segserve.model.accuracy import verdict


class BareForwardBeside:
    """The bare forward's entry at the point's shape, on the device its workers use, in short slices before and
    after its load (the same spell of the shared machine), watched for others as the point's windows are; the
    served ÷ bare ratio of the point from them."""

    def __init__(self, weights: Path, suite: Suite, compile_env: dict, log=print):
        self.weights, self.load, self.compile_env, self.log = weights, suite.load, compile_env, log
        self.slices: list[dict] = []

    def start(self, point: ResolvedPoint) -> None:
        self.slices = self.slice(point)

    def finish(self, point: ResolvedPoint, metrics: dict | None) -> dict:
        if point.bare_node is None or not metrics or not metrics.get("requests_ok"):
            return {}
        slices = self.slices + self.slice(point)
        beside = served_vs_bare(metrics.get("measured_window_throughputs_rps") or [], slices)
        beside["bare_device"] = next((entry.get("device") for entry in slices), None)
        return beside | ratio_judgement(metrics | beside)

    def slice(self, point: ResolvedPoint) -> list[dict]:
        if point.bare_node is None:
            return []
        threads, shape = bare_shape(point.params, point.bare_node)
        load = self.load
        entries = run_bare(
            self.weights, threads, [shape], seconds=load.bare_forward_s / 4, rounds=3, log=self.log, variant=point.variant,
            python=point.python, env=self.compile_env, max_others_share=load.max_others_share, retries=load.max_windows,
        )  # fmt: skip
        return entries[:1]


class AccuracyGate:
    """{iou, iou_eager, agreement, accurate, invalid_reason} of the point's network against eager fp32, scored
    once per variant; nothing for eager fp32 itself and for targets without weights."""

    def __init__(self, weights: Path, compile_env: dict, log=print):
        self.weights, self.compile_env, self.log = weights, compile_env, log
        self.scores: dict[str, dict] = {}  # by variant and Python: scored once per suite

    def start(self, point: ResolvedPoint) -> None:
        variant = point.variant
        if variant is None or (variant.get("optimize") or "eager", variant.get("precision") or "fp32") == ("eager", "fp32"):
            return
        key = _variant_key(point)
        if key in self.scores:
            return
        threads, _ = bare_shape(point.params, point.weights_node)
        try:
            scores = run_accuracy(self.weights, threads, variant, point.python, env=self.compile_env)
            valid, reason = verdict(scores)
            self.scores[key] = {k: scores[k] for k in ("iou", "iou_eager", "agreement")} | {"accurate": valid, "invalid_reason": reason}
        except RuntimeFailure as failure:
            self.scores[key] = {"accurate": False, "invalid_reason": str(failure)}
        self.log(f"accuracy of {variant.get('optimize')}/{variant.get('precision')}: {self.scores[key]}")

    def finish(self, point: ResolvedPoint, metrics: dict | None) -> dict:
        return self.scores.get(_variant_key(point), {})


def _variant_key(point: ResolvedPoint) -> str:
    """What the accuracy of a point's network is scored once for: its variant and the Python that runs it."""
    return json.dumps([point.variant, point.python], sort_keys=True, default=str)


class AutoscalerBeside:
    """segserve autoscale's loop beside an autoscaled point's load, on the bench's TorchServe: its workers' total is
    the budget, its DAG's YAML (an archive target: its .war's spec) gives each node's min/max. Its decisions go to
    the run dir's autoscale.jsonl and the record; the progress line counts its moves."""

    def __init__(self, torchserve, catalog: Catalog, suite: Suite):
        self.torchserve, self.catalog, self.settings = torchserve, catalog, suite.autoscaler
        self.running: InBackground | None = None

    def start(self, point: ResolvedPoint) -> None:
        if not point.point.autoscaled:
            return
        settings, server = self.settings, self.torchserve.server
        policy = Policy(sum(point.point.workers.values()), settings.hysteresis, settings.min_interval_s, settings.min_queue_ms)
        scaler = Autoscaler(server, target_bounds(self.catalog, point.target), policy, server.run_dir, log=lambda _line: None)
        self.running = InBackground(scaler, settings.interval_s).start()

    def finish(self, point: ResolvedPoint, metrics: dict | None) -> dict:
        if self.running is None:
            return {}
        scaled, self.running = self.running.stop(), None
        self.torchserve.current_workers = {}  # it moved workers: the next point scales every node to its own
        phases = [dict(phase) for phase in (metrics or {}).get("phases", [])]
        for phase, reaction in zip(phases, reactions(phases, scaled.get("autoscale_decisions", [])), strict=True):
            phase.update(reaction)
        return scaled | ({"phases": phases} if phases else {})


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


def bare_throughputs(records: list[dict], weights: Path, weights_node, log=print, load=None) -> list[dict]:
    """The bare forward throughput for every (batch size, threads, input size) the weights' node ran with, on
    the device it ran on (the record's `weights_device`: its handler setting). `weights_node(target name)`: the
    node of a target carrying the weights, or None.

    One process per thread count and device measures its shapes round-robin (segserve/model/bare.py), watched
    for others as the suite's windows are (`load`: its max_others_share and max_windows)."""
    watch = {"max_others_share": load.max_others_share, "retries": load.max_windows, "seconds": load.bare_forward_s} if load else {}
    shapes_by_run: dict[tuple[int, str], set] = {}
    for record in records:
        node = weights_node(record["target"])
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
