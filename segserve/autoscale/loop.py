"""The autoscaler's control loop (#16): beside a running segserve server, every interval read what each node of a
served DAG did (TorchServe's Prometheus counters and the handlers' own, the workers' CPU from /proc), decide
(segserve/autoscale/rules.py) and apply the move through the management API, the new worker first; of a fused pipeline,
its one model's workers (the thread rule sizes their threads). Every decision
is one JSON line in <run dir>/autoscale.jsonl (time, what it saw, the move, why, whether it was applied).

A user's own workflow (a .war segserve did not build, registered as <workflow>__<node> models) has no handler
counters: its samples come from TorchServe's queue and inference microseconds, the batch size and workers the
management API describes, and the workers' CPU (rules.py: source "torchserve").

The loop runs in its own process: if it dies, TorchServe keeps serving with the workers it last set.
"""

import json
import os
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import psutil

from segserve.archives.registration import REGISTRATIONS, WORKERS_WORKFLOW
from segserve.autoscale.rules import (
    TORCHSERVE,
    Bounds,
    Known,
    NodeSample,
    Policy,
    Trial,
    decide,
    decide_workers,
    judge,
    mix_of,
    pipeline_rps,
    same_mix,
)
from segserve.errors import RuntimeFailure, UsageError
from segserve.serving.metrics import HANDLER_PREFIX, scrape

DECISIONS_FILE = "autoscale.jsonl"
STAGES = ("decode", "predict", "encode")
STAGE_COUNTERS = ("SegserveDecodeMs", "SegservePredictMs", "SegserveEncodeMs")


def core_budget(cores: str | None) -> int:
    """--cores N or a list like 0-3,6 (its size); refused when larger than the cores this process may use."""
    available = len(os.sched_getaffinity(0))
    if cores is None:
        return available
    from segserve.serving.cores import parse_cores

    try:
        budget = int(cores) if cores.strip().isdigit() else len(parse_cores(cores))
    except ValueError as error:
        raise UsageError(f"--cores {cores}: {error}") from None
    if not 1 <= budget <= available:
        raise UsageError(f"--cores {cores}: a budget of {budget} core(s) but this machine lets us use {available}")
    return budget


def node_bounds(spec_models: dict, nodes: dict[str, str]) -> dict[str, Bounds]:
    """Per registered node model, min/max workers from the workflow YAML's `models:` (its workers keys)."""
    bounds = {}
    for node, model in nodes.items():
        given = spec_models.get(node) or {}
        least, most = WORKERS_WORKFLOW
        bounds[model] = Bounds(int(given.get(least, 1)), int(given.get(most, 64)))
    return bounds


def dag_bounds(catalog, dag: str) -> dict[str, Bounds]:
    """node_bounds of a catalog DAG: its workflow YAML's per-node min/max, by registered model name."""
    import yaml

    target = catalog.target(dag)
    spec = yaml.safe_load(catalog.dags[dag].spec_path.read_text()) or {}
    return node_bounds(spec.get("models", {}), {node.name: target.registered(node.name) for node in target.nodes})


def war_bounds(archive, workflow: str | None = None) -> dict[str, Bounds]:
    """node_bounds of a user's .war (segserve/archives/foreign.py: a ForeignArchive, its .war as archives/war.py reads
    it), by the model each model node is registered as (<workflow>__<node>; the workflow's name defaults to the
    archive's). Function nodes are left alone: TorchServe registers each with one worker and no batching."""
    war = archive.war
    if war is None:
        raise UsageError(
            archive.refusal or f"{archive.path}: not a workflow archive with a spec segserve can read (WAR-INF/MANIFEST.json → specFile)"
        )
    name = workflow or archive.name
    return node_bounds(war.spec.get("models") or {}, {node: f"{name}__{node}" for node in war.models})


def target_bounds(catalog, name: str) -> dict[str, Bounds]:
    """Per node of a suite's workflow target: a catalog DAG's YAML, or an archive target's .war spec."""
    archive = catalog.foreign.get(name)
    return war_bounds(archive) if archive is not None else dag_bounds(catalog, name)


class Meter:
    """Per-node deltas between two reads: requests served, queue and handler time, workers' CPU."""

    def __init__(self, server, models: list[str]):
        self.server, self.models = server, models
        self.last = self.read()

    def read(self) -> dict:
        workers, batch = {}, {}
        for model in self.models:
            described = self.server.describe(model)
            workers[model] = [int(w["pid"]) for w in described.get("workers", []) if int(w.get("pid") or -1) > 0]
            batch[model] = int(described.get(REGISTRATIONS["batch_size"].model_config) or 1)  # describe's key is the config's
        cpu = {}
        for pids in workers.values():
            for pid in pids:
                try:
                    times = psutil.Process(pid).cpu_times()
                    cpu[pid] = times.user + times.system
                except psutil.Error:
                    pass
        counters = scrape(self.server.url("metrics"))
        return {"time": time.monotonic(), "counters": counters, "workers": workers, "cpu": cpu, "batch": batch}

    def samples(self) -> list[NodeSample]:
        now = self.read()
        before, self.last = self.last, now
        return samples_between(before, now, self.models)


def samples_between(before: dict, after: dict, models: list[str]) -> list[NodeSample]:
    """Per model, what it did between two reads: from segserve's handler counters where the handler emits them,
    else from TorchServe's alone (source "torchserve": no request count, see rules.py)."""
    interval_s = max(after["time"] - before["time"], 1e-6)
    found = []
    for model in models:

        def delta(counter: str, model: str = model) -> float:
            return after["counters"].get((counter, model), 0.0) - before["counters"].get((counter, model), 0.0)

        cpu_s = sum(after["cpu"].get(pid, 0.0) - before["cpu"].get(pid, 0.0) for pid in after["workers"][model])
        if (f"{HANDLER_PREFIX}Requests", model) not in after["counters"]:
            queue_us = max(delta("ts_queue_latency_microseconds"), 0.0)
            busy_us = max(delta("ts_inference_latency_microseconds") - queue_us, 0.0)  # its inference latency includes the queue
            per_second = 1e6 * interval_s * after.get("batch", {}).get(model, 1)
            found.append(
                NodeSample(
                    node=model,
                    workers=len(after["workers"][model]),
                    cpu_cores=round(cpu_s / interval_s, 3),
                    queue_ms=None,
                    handler_ms=None,
                    served_rps=None,
                    source=TORCHSERVE,
                    busy_workers=round(busy_us / per_second, 3),
                    waiting_batches=round(queue_us / per_second, 3),
                )
            )
            continue
        served = delta(f"{HANDLER_PREFIX}Requests")
        found.append(
            NodeSample(
                node=model,
                workers=len(after["workers"][model]),
                cpu_cores=round(cpu_s / interval_s, 3),
                queue_ms=round(delta("ts_queue_latency_microseconds") / served / 1000, 2) if served else 0.0,
                handler_ms=round(sum(delta(c) for c in STAGE_COUNTERS) / served, 2) if served else 0.0,
                served_rps=round(served / interval_s, 2),
                stages_ms={stage: round(delta(c) / served, 2) for stage, c in zip(STAGES, STAGE_COUNTERS, strict=True)} if served else {},
            )
        )
    return found


class Autoscaler:
    """`bounds`: the nodes of one served workflow (workers move between them), or with `fused` the one model of a
    fused pipeline (its workers × threads follow the load)."""

    def __init__(
        self, server, bounds: dict[str, Bounds], policy: Policy, run_dir: Path, dry_run: bool = False, log=print, fused: bool = False
    ):
        if fused and len(bounds) != 1:
            raise UsageError(f"a fused pipeline is one model: got {', '.join(bounds)}")
        registered = set(server.models() if fused else server.workflow_nodes())
        missing = sorted(set(bounds) - registered)
        if missing:
            what = "the fused pipeline" if fused else "the workflow"
            raise RuntimeFailure(f"not registered on the server from {run_dir}: {', '.join(missing)} (serve {what} first)")
        self.server, self.bounds, self.policy, self.dry_run, self.log, self.fused = server, bounds, policy, dry_run, log, fused
        self.decisions = Path(run_dir) / DECISIONS_FILE
        self.meter = Meter(server, list(bounds))
        self.last_move_s: float | None = None
        self.trial: Trial | None = None  # the last move, judged on the next interval
        self.known: list[Known] = []  # what splits served at a mix, from the moves' trials
        self.rates: list[float] = []  # the pipeline's req/s in each interval since the last move, at this mix
        self.last_mix: dict[str, float] | None = None

    def step(self) -> dict:
        samples = self.meter.samples()
        now, rate, mix = time.monotonic(), pipeline_rps(samples), mix_of(samples)
        trial, self.trial = self.trial, None
        if trial is not None:
            decision = judge(trial, samples, self.policy, now)
            until_s = now + self.policy.retry_after_s
            self.known += [
                Known(trial.before, trial.mix, trial.rate_before_rps, until_s),
                Known(trial.after, trial.mix, rate, until_s),
            ]
        else:
            self.known = [k for k in self.known if k.until_s > now]
            if self.fused:
                (sample,) = samples
                decision = decide_workers(sample, self.bounds[sample.node], self.policy, now, self.last_move_s, self.known, self.last_mix)
            else:
                decision = decide(samples, self.bounds, self.policy, now, self.last_move_s, self.known, self.last_mix)
        if self.last_mix is not None and not same_mix(self.last_mix, mix, self.policy.mix_tolerance):
            self.rates = []  # a move is judged against rates served at its own mix
        self.last_mix = mix
        record = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "epoch_s": round(time.time(), 3),
            "metrics": [asdict(s) for s in samples],
            "move": decision.steps,
            "target": decision.target,
            "why": decision.reason,
            "applied": False,
            "error": None,
        }
        self.rates.append(rate)
        if decision.steps and not self.dry_run:
            started = time.monotonic()
            try:
                for model, workers in decision.steps:  # in order: the new worker ready before one goes
                    self.server.scale(model, workers)
                    self.server.wait_ready(model)
                record["applied"] = True
                record["move_s"] = round(time.monotonic() - started, 2)  # until the new worker was ready
                self.last_move_s = time.monotonic()
                before = self.rates[-2:]
                # judged on the next interval against the rate before it (two intervals, less noise); a rate not
                # counted (TorchServe's counters alone) judges nothing: the move is kept
                if trial is None and None not in before:
                    self.trial = Trial(decision.current, decision.current | dict(decision.steps), sum(before) / len(before), mix)
            except RuntimeFailure as error:  # the management API refused: said, nothing more changed by us
                record["error"] = str(error).splitlines()[0]
            # the next interval starts now, with the new workers ready: their start-up is not the split's load
            self.meter.last = self.meter.read()
            self.rates = []
        with open(self.decisions, "a") as out:
            out.write(json.dumps(record) + "\n")
        self.log(f"{record['time']} {decision.reason}" + (f" — {record['error']}" if record["error"] else ""))
        return record

    def run(self, interval_s: float, intervals: int | None = None) -> None:
        done = 0
        while intervals is None or done < intervals:
            time.sleep(interval_s)
            self.step()
            done += 1


class InBackground:
    """The loop in a thread beside a measurement (a suite's autoscaled point): what it decided, and its own CPU
    time (the thread's, so the load generator beside it is not counted)."""

    def __init__(self, scaler: Autoscaler, interval_s: float):
        self.scaler, self.interval_s = scaler, interval_s
        self.done = threading.Event()
        self.records: list[dict] = []
        self.cpu_s, self.failure = 0.0, None
        self.thread = threading.Thread(target=self._loop, name="autoscaler", daemon=True)

    def start(self) -> "InBackground":
        self.started = time.monotonic()
        self.thread.start()
        return self

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        try:
            while not self.done.wait(self.interval_s):
                self.records.append(self.scaler.step())
        except Exception as failure:  # the loop dies, the server keeps serving with the workers it last set
            self.failure = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def stop(self) -> dict:
        """{autoscaler_cpu_pct, autoscaler_moves, autoscale_decisions, autoscaler_failure}"""
        self.done.set()
        self.thread.join()
        wall_s = max(time.monotonic() - self.started, 1e-6)
        return {
            "autoscaler_cpu_pct": round(100 * self.cpu_s / wall_s, 3),
            "autoscaler_moves": sum(len(r["move"]) for r in self.records if r["applied"]),
            "autoscale_decisions": self.records,
            "autoscaler_failure": self.failure,
        }


def reactions(phases: list[dict], decisions: list[dict]) -> list[dict]:
    """Per phase: the applied moves decided in it and the seconds from its start to the first (`reaction_s`;
    None when it moved nothing)."""
    found = []
    for index, phase in enumerate(phases):
        end_s = phases[index + 1]["started_epoch_s"] if index + 1 < len(phases) else float("inf")
        moves = [d for d in decisions if d["applied"] and phase["started_epoch_s"] <= d["epoch_s"] < end_s]
        first = moves[0] if moves else None
        found.append(
            {
                "moves": [step for d in moves for step in d["move"]],
                "reaction_s": round(first["epoch_s"] - phase["started_epoch_s"], 1) if first else None,
                "move_s": first.get("move_s") if first else None,
            }
        )
    return found


def last_decisions(run_dir: Path, count: int = 5) -> list[dict]:
    path = Path(run_dir) / DECISIONS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[-count:]]


def start_beside(server, config: str, dag: str) -> int:
    """`segserve autoscale` beside the server, in a session of its own and marked as the server's process (the
    run dir in its environment), so that `serve --stop` stops it with the server; it dies alone otherwise."""
    import subprocess
    import sys

    from segserve.serving.processes import MARKER

    command = [sys.executable, "-m", "segserve.cli", "autoscale", "--run-dir", str(server.run_dir), "--config", config, "--dag", dag]
    log = open(server.run_dir / "logs" / "autoscale.log", "a")  # noqa: SIM115 (the child keeps it)
    child = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, MARKER: str(server.run_dir.resolve())},
    )
    log.close()
    return child.pid
