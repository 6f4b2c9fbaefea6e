"""Run a suite against a live TorchServe: reconfigure as little as possible, measure each point, save results.

One JSON per point under runs/ as soon as it is measured (so --resume can skip
it), then summary.csv/jsonl, report.md, plots and best/ at the end.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from segserve.bench import plan as planning
from segserve.bench.inputs import class_maps, request_bodies
from segserve.bench.load import LoadSpec, run_load
from segserve.bench.report import ratio
from segserve.bench.server_metrics import ProcessSampler, handler_stages, per_request_ms, scrape
from segserve.bench.stats import latency_summary, spread, stable_tail
from segserve.bench.suite import Suite
from segserve.build import archive_model, archive_workflow, stage_fused_extras, stage_handler_package, write_model_config
from segserve.errors import UsageError
from segserve.server import TorchServe

PATHS = {
    "seg": "/predictions/seg",
    "jpeg": "/predictions/jpeg",
    "seg_jpeg": "/wfpredict/seg_jpeg",
    "seg_jpeg_fused": "/predictions/seg_jpeg_fused",
}
MODELS = {"seg": ["seg"], "jpeg": ["jpeg"], "seg_jpeg": ["seg_jpeg__seg", "seg_jpeg__jpeg"], "seg_jpeg_fused": ["seg_jpeg_fused"]}
# Archive-level grid parameters that are handler settings, by stage: grid name → model_config `handler:` key.
RUNNER_PARAMS = {"micro_batch_size": "micro_batch_size", "overlap": "overlap", "decode_threads": "decode_threads"}
HANDLER_PARAMS = {
    "seg": {"precision": "precision", "input_size": "input_size", **RUNNER_PARAMS},
    "jpeg": {"jpeg_quality": "quality", **RUNNER_PARAMS},
    "seg_jpeg_fused": RUNNER_PARAMS,  # node settings (precision, quality) go to its node configs
}
CLIENT_SATURATED_PCT = 80.0  # of one core: above this the generator itself may be the limit


def handler_settings(stage: str, archive: dict, nodes_only: bool = False) -> dict:
    """The model_config `handler:` values a point's archive parameters set for a stage."""
    settings = {
        key: archive[param]
        for param, key in HANDLER_PARAMS[stage].items()
        if param in archive and not (nodes_only and param in RUNNER_PARAMS)
    }
    if "input_size" in settings:  # the light preset: a smaller model input, same images
        settings["input_height"], settings["input_width"] = settings.pop("input_size")
    return settings


class Bench:
    def __init__(self, suite: Suite, root: Path, out_dir: Path, weights: Path, log=print):
        self.suite, self.root, self.out_dir, self.weights, self.log = suite, root, out_dir, weights, log
        self.points = planning.expand(suite)
        self.store = Path(tempfile.mkdtemp(prefix="segserve-bench-store-"))
        self.server: TorchServe | None = None
        self.server_key = self.registered_key = None
        self.current_workers: dict[str, int] = {}

    # Archives ------------------------------------------------------------------
    def archive_for(self, stage: str, archive: dict) -> str:
        """The .mar of a stage (seg, jpeg or the fused seg_jpeg_fused) with this point's handler settings,
        which live inside the archive; built once per distinct setting."""
        settings = handler_settings(stage, archive)
        name = f"{stage}-" + hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
        if (self.store / f"{name}.mar").exists():
            return f"{name}.mar"
        staging = Path(tempfile.mkdtemp(prefix="segserve-bench-stage-"))
        configs = self.root / "model_config"
        extra = stage_handler_package(self.root, staging)
        if stage == "seg_jpeg_fused":
            # Node settings go into the node configs packed beside the spec; stage settings to the fused worker.
            nodes = {
                node: write_model_config(
                    configs / f"{node}.yaml",
                    staging / f"node-{node}.yaml",
                    handler_settings(node, archive, nodes_only=True),
                )
                for node in ("seg", "jpeg")
            }
            stage_fused_extras(extra, self.root / "workflows" / "seg_jpeg.yaml", nodes)
        config = write_model_config(configs / f"{stage}.yaml", staging / f"{name}.yaml", settings)
        handler = self.root / "handlers" / {"seg": "segmentation", "jpeg": "jpeg", "seg_jpeg_fused": "pipeline"}[stage]
        weights = None if stage == "jpeg" else self.weights
        archive_model(name, handler, weights, config, extra, self.store, lambda _: None)
        shutil.rmtree(staging)
        return f"{name}.mar"

    # Reconfiguration -------------------------------------------------------------
    def ensure_server(self, point: planning.Point) -> None:
        if self.server is not None and self.server_key == point.server:
            return
        self.stop_server()
        params = dict(point.server)
        env = {"OMP_NUM_THREADS": str(params["omp_num_threads"])} if "omp_num_threads" in params else {}
        if "omp_wait_policy" in params:
            env["OMP_WAIT_POLICY"] = params["omp_wait_policy"].upper()
        overrides = {"number_of_netty_threads": str(params["netty_threads"])} if "netty_threads" in params else {}
        pinning = params.get("pinning", "none")
        if pinning == "torchserve":
            if not shutil.which("numactl"):
                raise UsageError("pinning 'torchserve' needs numactl: apt-get install numactl (or `make setup-numactl`)")
            overrides["cpu_launcher_enable"] = "true"
        core_plan = Path(self.suite.core_plan) if pinning == "plan" else None
        run_dir = Path(tempfile.mkdtemp(prefix="segserve-bench-ts-"))
        self.server = TorchServe(
            run_dir, self.store, self.root / "config.properties", free_ports=True, config_overrides=overrides, env=env, core_plan=core_plan
        )
        self.server.start(log=lambda _: None)
        self.server_key, self.registered_key, self.current_workers = point.server, None, {}

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            shutil.rmtree(self.server.run_dir, ignore_errors=True)
        self.server = self.server_key = self.registered_key = None

    def ensure_registered(self, point: planning.Point) -> None:
        key = (point.target, point.archive)
        if self.registered_key == key:
            return
        server, archive, workers = self.server, dict(point.archive), point.workers
        if self.registered_key is not None:
            previous = self.registered_key[0]
            if previous == "seg_jpeg":
                server.unregister("workflows", "seg_jpeg")
            else:
                server.unregister("models", previous)
        self.registered_key = None
        workflow = point.target == "seg_jpeg"
        seg_mar = self.archive_for("seg", archive) if point.target == "seg" or workflow else None
        jpeg_mar = self.archive_for("jpeg", archive) if point.target == "jpeg" or workflow else None
        if point.target in ("seg", "jpeg", "seg_jpeg_fused"):
            url = {"seg": seg_mar, "jpeg": jpeg_mar}.get(point.target) or self.archive_for("seg_jpeg_fused", archive)
            server.register_model(
                url, point.target, workers[point.target], archive["batch_size"], archive["max_batch_delay_ms"], log=lambda _: None
            )
        elif point.target == "seg_jpeg":
            spec = {
                "models": {
                    "batch-size": archive["batch_size"],
                    "max-batch-delay": archive["max_batch_delay_ms"],
                    "timeout-ms": 120000,
                    "seg": {"url": seg_mar, "min-workers": workers["seg"], "max-workers": workers["seg"]},
                    "jpeg": {"url": jpeg_mar, "min-workers": workers["jpeg"], "max-workers": workers["jpeg"]},
                },
                "dag": {"seg": ["jpeg"]},
            }
            spec_dir = Path(tempfile.mkdtemp(prefix="segserve-bench-spec-"))
            (spec_dir / "seg_jpeg.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
            shutil.copy(self.root / "workflows" / "seg_jpeg_handler.py", spec_dir)
            archive_workflow(spec_dir / "seg_jpeg.yaml", self.store, lambda _: None)
            server.register_workflow("seg_jpeg.war", "seg_jpeg", log=lambda _: None)
            shutil.rmtree(spec_dir)
        for model in MODELS[point.target]:
            server.wait_ready(model)
        self.registered_key = key
        self.current_workers = dict(workers)

    def ensure_workers(self, point: planning.Point) -> None:
        for stage, count in point.workers.items():
            if self.current_workers.get(stage) != count:
                model = f"seg_jpeg__{stage}" if point.target == "seg_jpeg" else point.target
                self.server.scale(model, count)
                # TorchServe's CPU launcher restarts every worker of the model on a scale: wait for them.
                self.server.wait_ready(model)
                self.current_workers[stage] = count

    # Measurement -----------------------------------------------------------------
    def measure(self, point: planning.Point, bodies: list[bytes]) -> dict:
        load, params, server = self.suite.load, point.params, self.server
        spec = LoadSpec(
            url=server.url("inference"),
            path=PATHS[point.target],
            bodies=bodies,
            token=server.token("inference"),
            concurrency=params.get("concurrency", load.max_connections),
            request_rate_rps=params.get("request_rate_rps"),
            arrival=load.arrival,
            timeout_s=load.timeout_s,
        )
        window_s, warmup_s = load.window_s, load.warmup_s

        def window_rates(result) -> list[float]:
            done = int((max(result.end_s, default=0.0) - warmup_s) // window_s)
            edges = [warmup_s + k * window_s for k in range(done + 1)]
            return [sum(result.window(a, b).ok) / window_s for a, b in zip(edges, edges[1:], strict=False)]

        def settled(result) -> bool:
            return stable_tail(window_rates(result), load.stable_windows, load.stability_tolerance)

        metrics_url = server.url("metrics")
        before, sampler = scrape(metrics_url), ProcessSampler(self.process_groups(point))
        sampler.start()
        result = run_load(spec, warmup_s + load.max_windows * window_s, stop_early=settled, check_every_s=window_s / 2)
        server_usage, after = sampler.stop(), scrape(metrics_url)
        rates = window_rates(result)
        stable = stable_tail(rates, load.stable_windows, load.stability_tolerance)
        used = load.stable_windows if stable else len(rates)
        start_s = warmup_s + (len(rates) - used) * window_s
        measured = result.window(start_s, warmup_s + len(rates) * window_s)
        ok_latencies = [lat for lat, ok in zip(measured.latency_ms, measured.ok, strict=True) if ok]
        requests_ok = len(ok_latencies)
        client_cpu_pct = 100 * result.client_cpu_s / result.wall_s if result.wall_s else None
        return {
            "duration_s": measured.wall_s,
            "requests_ok": requests_ok,
            "requests_failed": len(measured.status) - requests_ok,
            "failures_by_status": {k: v for k, v in measured.status_counts().items() if not k.startswith("2")},
            "throughput_rps": requests_ok / measured.wall_s if measured.wall_s else 0.0,
            **latency_summary(ok_latencies),
            **per_request_ms(before, after, MODELS[point.target], len(result.status)),
            **self.stage_columns(handler_stages(before, after, MODELS[point.target])),
            "client_cpu_pct": client_cpu_pct,
            "client_cpu_ms_per_request": 1000 * result.client_cpu_s / max(len(result.status), 1),
            "client_saturated": bool(client_cpu_pct and client_cpu_pct > CLIENT_SATURATED_PCT),
            "stable": stable,
            "windows": len(rates),
            "window_throughputs_rps": rates,
            "window_spread": spread(rates[-used:]) if rates else None,
            "warmup_s": warmup_s,
            **server_usage,
        }

    @staticmethod
    def stage_columns(stages: dict[str, dict[str, float]]) -> dict:
        """Per-node stage times and bytes (nested, in the run JSON) and the bytes columns of the summary."""
        first = next(iter(stages.values()), {})
        return {
            "server_stages": stages,
            # What the first node hands on: to the next node in a workflow, to the client otherwise.
            "bytes_out_per_request": first.get("response_bytes"),
            "bytes_device_to_host_per_request": sum(s.get("device_to_host_bytes", 0.0) for s in stages.values()) if stages else None,
        }

    def process_groups(self, point: planning.Point) -> dict[str, list[int]]:
        """Server processes by role: the Java frontend, each worker ("<model>/<pid>"), the rest."""
        groups: dict[str, list[int]] = {}
        for model in MODELS[point.target]:
            for worker in self.server.describe(model).get("workers", []):
                if int(worker.get("pid") or -1) > 0:  # -1: a worker still starting
                    groups[f"{model}/{worker['pid']}"] = [int(worker["pid"])]
        workers = {pid for pids in groups.values() for pid in pids}
        for pid in self.server.process_ids():
            if pid not in workers:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if Path(f"/proc/{pid}").exists() else b""
                groups.setdefault("frontend" if b"java" in cmdline.split(b"\0")[0] else "other", []).append(pid)
        return groups

    def record_for(self, point: planning.Point, reconfigure_s: float, metrics: dict | None, error: str | None) -> dict:
        params, workers = point.params, point.workers
        return {
            "run_id": point.run_id,
            "target": point.target,
            "workers": next(iter(workers.values())),
            "batch_size": params["batch_size"],
            "max_batch_delay_ms": params["max_batch_delay_ms"],
            "concurrency": params.get("concurrency"),
            "request_rate_rps": params.get("request_rate_rps"),
            **params,
            **(metrics or {}),
            "reconfigure_s": round(reconfigure_s, 3),
            "error": error,
        }

    # The whole run -----------------------------------------------------------------
    def run(self, environment_info: dict) -> list[dict]:
        runs_dir = self.out_dir / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        done = {p.stem: json.loads(p.read_text()) for p in runs_dir.glob("*.json")}
        # Failed points are measured again on --resume; finished ones are kept.
        todo = [p for p in self.points if p.run_id not in done or done[p.run_id].get("error")]
        if done:
            self.log(f"resuming: {len(self.points) - len(todo)} of {len(self.points)} points already measured")
        if not todo:
            return [done[p.run_id] for p in self.points]
        bodies = request_bodies(self.suite)
        bodies_for = {target: bodies for target in PATHS}
        if "jpeg" in self.suite.targets:
            bodies_for["jpeg"] = class_maps(bodies, self.weights, self.root / "model_config" / "seg.yaml")
        progress = Progress(len(todo), self.log)
        try:
            for point in todo:
                started = time.monotonic()
                metrics = error = None
                try:
                    self.ensure_server(point)
                    self.ensure_registered(point)
                    self.ensure_workers(point)
                    reconfigure_s = time.monotonic() - started
                    metrics = self.measure(point, bodies_for[point.target])
                except Exception as failure:  # one failed point must not lose the others
                    reconfigure_s = time.monotonic() - started
                    error = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
                    self.stop_server()  # start clean for the next point
                record = {**self.record_for(point, reconfigure_s, metrics, error), "environment": environment_info}
                if point.target == "seg" and not error:
                    record["bare_forward_ips"] = self.bare_beside(record)
                    record["ratio_bare"] = ratio(record["throughput_rps"], record["bare_forward_ips"])
                (runs_dir / f"{point.run_id}.json").write_text(json.dumps(record, indent=2) + "\n")
                done[point.run_id] = record
                progress.step(point, record, time.monotonic() - started)
        finally:
            self.stop_server()
            shutil.rmtree(self.store, ignore_errors=True)
        return [done[p.run_id] for p in self.points if p.run_id in done]

    def bare_throughputs(self, records: list[dict]) -> list[dict]:
        """The bare forward throughput for every (batch size, threads, input size) that seg ran with.

        One process per thread count measures its shapes round-robin (segserve/bench/bare.py)."""
        shapes_by_threads: dict[int, set] = {}
        for r in records:
            if r["target"] != "jpeg":
                threads, shape = bare_shape(r)
                shapes_by_threads.setdefault(threads, set()).add(shape)
        return [entry for threads, shapes in sorted(shapes_by_threads.items()) for entry in self.run_bare(threads, sorted(shapes))]

    def bare_beside(self, record: dict) -> float | None:
        """The bare forward at a seg point's shape and threads, right after the point: the same spell of the
        shared machine as the served number, so their ratio is not skewed by drift between them."""
        threads, shape = bare_shape(record)
        entries = self.run_bare(threads, [shape], seconds=4.0, rounds=2)
        return entries[0]["throughput_ips"] if entries else None

    def run_bare(self, threads: int, shapes: list[str], seconds: float = 6.0, rounds: int = 3) -> list[dict]:
        command = [sys.executable, "-m", "segserve.bench.bare", "--weights", str(self.weights), "--threads", str(threads)]
        command += [arg for shape in shapes for arg in ("--shape", shape)] + ["--seconds", str(seconds), "--rounds", str(rounds)]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if done.returncode != 0:
            self.log(f"bare forward with {threads} threads failed: {done.stderr.strip()[-300:]}")
            return []
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def bare_shape(record: dict) -> tuple[int, str]:
    """(threads, "batch:height:width") of a record's seg stage, as segserve.bench.bare takes it."""
    threads = record.get("omp_num_threads") or len(os.sched_getaffinity(0))
    height, width = record.get("input_size") or (256, 448)
    return threads, f"{record['batch_size']}:{height}:{width}"


class Progress:
    """One line per finished point, with a bar and an ETA from the mean time per point so far."""

    def __init__(self, total: int, log):
        self.total, self.log, self.done, self.started = total, log, 0, time.monotonic()

    def step(self, point: planning.Point, record: dict, elapsed_s: float) -> None:
        self.done += 1
        eta_s = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        bar = "#" * round(20 * self.done / self.total)
        params = " ".join(f"{k}={v}" for k, v in point.params.items())
        if record["error"]:
            outcome = f"FAILED {record['error']}"
        else:
            outcome = f"{record['throughput_rps']:.1f} req/s, p99 {record['latency_p99_ms'] or float('nan'):.0f} ms"
        self.log(f"[{bar:<20}] {self.done}/{self.total} {point.target} {params}: {outcome} ({elapsed_s:.0f}s; ETA {eta_s / 60:.1f} min)")
