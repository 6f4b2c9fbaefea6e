"""Measure one deployed point: load in windows until the throughput settles, the server's own counters,
its processes' CPU and the GPUs' use around it. The bare model's forward throughput, the compute limit it is
held against, is measured by bare_forward.py.

Reads nothing of the catalog or the suite's targets: an Endpoint says where to send and what to ask, so an
endpoint segserve did not deploy (no metrics URL) is measured by the same code.
"""

import time
from dataclasses import dataclass, replace
from pathlib import Path

from segserve.archives.war import WarSpec
from segserve.bench.results.stats import latency_summary, mean_interval, spread, stable_tail
from segserve.bench.run.failures import LogMark, attributed, input_names, merged
from segserve.bench.run.load import LoadResult, LoadSpec
from segserve.bench.run.load_processes import live_pids, run_load_processes
from segserve.bench.run.lost_answers import point_lost
from segserve.bench.run.stalls import explained, find_stalls, stall_cause, stall_columns
from segserve.bench.suite.spec import LoadSettings
from segserve.errors import RuntimeFailure
from segserve.machine.disturbance import DisturbanceSampler
from segserve.machine.gpu_usage import GpuUsageSampler
from segserve.serving.metrics import ProcessSampler, cpu_ms_per_request, cpu_s_of, handler_stages, per_request_ms, scrape

CLIENT_SATURATED_PCT = 80.0  # of one core: above this the generator itself may be the limit


MODEL_PATH = "/predictions/"  # a model's inference path; what follows is its name (or name/version)


@dataclass(frozen=True)
class Endpoint:
    """Where a deployed point answers, and what to ask about it."""

    url: str  # base URL, loopback
    path: str
    token: str | None
    headers: dict
    metrics_url: str | None  # None: not ours (an http target): no server columns
    models: tuple[str, ...]  # TorchServe models whose counters describe it
    grpc_url: str | None = None  # TorchServe's gRPC inference API (grpc://host:port), for load.protocol grpc
    logs: Path | None = None  # TorchServe's logs folder (ours): failed requests are attributed to the nodes they name
    workflow: WarSpec | None = None  # a workflow's .war as registered: its DAG and each node's timeout-ms (lost answers)


def measure(
    endpoint: Endpoint,
    load: LoadSettings,
    params: dict,
    bodies: list[bytes],
    process_groups: dict | None,
    fresh_workers: bool = False,
    prune=None,
) -> dict:
    """The metrics of one point: throughput and latency from the stable windows, server columns where it is ours.
    fresh_workers: the deployment has just started the workers (warm up for fresh_workers_warmup_s more).
    prune(window rates so far) → True: the point is hopeless (a search's pruner): stop measuring it, `pruned`."""
    concurrency, rate_rps = params.get("concurrency", load.max_connections), params.get("request_rate_rps")
    spec = _load_spec(endpoint, load, bodies, concurrency, rate_rps, _protocol(params, bodies))
    window_s, warmup_s = load.window_s, load.warmup_s + (load.fresh_workers_warmup_s if fresh_workers else 0.0)
    ours = endpoint.metrics_url is not None
    # Others' CPU can only be told apart from the server's when the server's processes are known (ours).
    server_pids = [pid for pids in process_groups.values() for pid in pids] if process_groups else []
    disturbance = DisturbanceSampler(server_pids, own_pids=live_pids) if process_groups else None
    windows = _Windows(window_s, warmup_s, load.max_others_share, disturbance)
    settled = _Settled(windows, load, prune)
    before = scrape(endpoint.metrics_url) if ours else {}
    # every half window: the server's CPU over the measured windows, as the disturbance sampler's shares
    sampler = ProcessSampler(process_groups, interval_s=window_s / 4) if process_groups else None
    gpu = GpuUsageSampler()  # the machine's GPUs, whoever's the server is (an http target's too)
    for started in (sampler, disturbance, gpu):
        if started:
            started.start()
    # disturbed windows are measured again: up to max_windows more
    budget_windows = load.max_windows * (2 if disturbance else 1)
    mark = LogMark(endpoint.logs) if endpoint.logs else None
    try:
        result = run_load_processes(spec, warmup_s + budget_windows * window_s, load.client_processes, settled, window_s / 2)
    finally:  # their threads end with the load, also when it fails
        if disturbance:
            disturbance.stop()
        gpu.stop()
    server_usage = sampler.stop() if sampler else {}
    after = scrape(endpoint.metrics_url) if ours else {}
    # the windows end where the load stopped sending: the requests still awaited after it (a stall's) fill none
    windows = replace(windows, until_s=settled.stopped_s or warmup_s + budget_windows * window_s)
    chosen = _choose_windows(result, windows, load, settled.pruned)
    stalls = find_stalls(result, window_s, concurrency, rate_rps)  # the server's own: not others' disturbance
    chosen = explained(chosen, stalls)
    measured = result.windows(chosen.used)
    used_rates = _rates(result, chosen.used)  # the windows the numbers come from
    failures = attributed(measured, input_names(bodies), result, mark, load.timeout_s)
    lost = point_lost(endpoint.workflow, failures, result, windows.until_s, load.timeout_s)
    return {
        **protocol_of(bodies),
        **_windowed_throughput_columns(measured, used_rates),
        "failures": failures,
        **(_server_columns(endpoint, before, after, len(result.status), spec.url) if ours else {}),
        **_client_columns(result, load.client_processes),
        **_window_columns(result, windows, chosen, used_rates, settled.pruned),
        # the windows the numbers come from, seconds since the load started (a cluster's node CPU is taken over them)
        "measured_windows_s": [[round(a, 3), round(b, 3)] for a, b in chosen.used],
        "warmup_s": warmup_s,
        **server_usage,
        # the server's CPU per request over the windows the numbers come from (the sampler's clock starts with the
        # load's, as the disturbance sampler's), and over the whole run, warm-up and a fresh JVM's compiles included
        **cpu_ms_per_request(sampler.between(chosen.used) if sampler else {}, len(measured.status)),
        **cpu_ms_per_request(cpu_s_of(server_usage.get("server_processes", {})), len(result.status), "_whole_run"),
        **gpu.columns(chosen.used),
        **stall_columns(stalls),
        # and the node whose timeout-ms passed then, or the answers lost
        "stall_cause": stall_cause(stalls, failures, load.timeout_s, lost["lost_cause"]),
        **lost,
    }


@dataclass(frozen=True)
class _Windows:
    """The windows of a load run after its warm-up, window_s each, and which of them others left alone."""

    window_s: float
    warmup_s: float
    max_others_share: float
    disturbance: DisturbanceSampler | None  # None: others' use unknown
    until_s: float = float("inf")  # when the load stopped sending, once it has

    def edges(self, result: LoadResult) -> list[tuple[float, float]]:
        done = int((min(max(result.end_s, default=0.0), self.until_s) - self.warmup_s) // self.window_s)
        return [(self.warmup_s + k * self.window_s, self.warmup_s + (k + 1) * self.window_s) for k in range(max(done, 0))]

    def others_share(self, span: tuple[float, float]) -> float | None:
        return self.disturbance.share(*span)[0] if self.disturbance else None

    def clean(self, result: LoadResult) -> list[tuple[float, float]]:
        """The windows others left alone (unknown: counted as clean)."""
        return [span for span in self.edges(result) if (self.others_share(span) or 0.0) <= self.max_others_share]


def _rates(result: LoadResult, spans: list[tuple[float, float]]) -> list[float]:
    return [result.rate_rps(a, b) for a, b in spans]


class _Settled:
    """When the load may stop (run_load_processes' `settled`): the clean windows' rates are stable, the window budget
    is spent, or the pruner gave up on the point (then `pruned`)."""

    def __init__(self, windows: _Windows, load: LoadSettings, prune):
        self.windows, self.load, self.prune = windows, load, prune
        self.pruned = False
        self.stopped_s: float | None = None  # when it said stop (seconds of the load)

    def __call__(self, result: LoadResult) -> bool:
        spans = self.windows.clean(result)
        so_far = _rates(result, spans)
        if self.prune is not None and so_far and self.prune(so_far):
            self.pruned = True
        stable = stable_tail(so_far, self.load.stable_windows, self.load.stability_tolerance)
        if self.pruned or stable or len(spans) >= self.load.max_windows:
            self.stopped_s = result.wall_s
            return True
        return False


@dataclass(frozen=True)
class _ChosenWindows:
    """Which windows of a load run the numbers come from (`used`), and why."""

    all_spans: list[tuple[float, float]]
    clean_spans: list[tuple[float, float]]
    stable: bool
    disturbed: bool
    used: list[tuple[float, float]]


def _choose_windows(result: LoadResult, windows: _Windows, load: LoadSettings, pruned: bool) -> _ChosenWindows:
    all_spans, clean_spans = windows.edges(result), windows.clean(result)
    stable = stable_tail(_rates(result, clean_spans), load.stable_windows, load.stability_tolerance)
    disturbed = len(clean_spans) < load.stable_windows and not pruned  # a pruned point stopped early on purpose
    used = clean_spans[-load.stable_windows :] if stable else (all_spans if disturbed else clean_spans)
    return _ChosenWindows(all_spans, clean_spans, stable, disturbed, used)


def _windowed_throughput_columns(measured: LoadResult, used_rates: list[float]) -> dict:
    """Requests, throughput and latency over the windows the numbers come from."""
    ok_latencies = _ok_latencies(measured)
    interval = mean_interval(used_rates)
    return {
        **_request_columns(measured, ok_latencies),
        # the mean of the windows' rates (edges on completions: see LoadResult.rate_rps), as its interval is
        "throughput_rps": sum(used_rates) / len(used_rates) if used_rates else 0.0,
        # 95% interval of the mean over the measured windows
        "throughput_ci_low_rps": interval[0] if interval else None,
        "throughput_ci_high_rps": interval[1] if interval else None,
        **latency_summary(ok_latencies),
    }


def _window_columns(result: LoadResult, windows: _Windows, chosen: _ChosenWindows, used_rates: list[float], pruned: bool) -> dict:
    """Every window's rate, which were used, and how much others disturbed them."""
    all_spans, disturbance = chosen.all_spans, windows.disturbance
    shares = [windows.others_share(span) for span in all_spans]
    steal = [disturbance.share(*span)[1] for span in all_spans] if disturbance else []
    window_rates = _rates(result, all_spans)
    return {
        "stable": chosen.stable,
        "pruned": pruned,
        "windows": len(window_rates),
        "window_throughputs_rps": window_rates,
        "window_spread": spread(used_rates) if used_rates else None,
        "measured_window_throughputs_rps": used_rates,
        # others' share of the machine per window (% of all cores), and what was done about it
        "window_others_cpu_pct": [None if v is None else round(100 * v, 1) for v in shares],
        "others_cpu_pct": max(
            (100 * v for v, span in zip(shares, all_spans, strict=True) if v is not None and span in chosen.used), default=None
        ),
        "steal_pct": max((100 * v for v in steal if v is not None), default=None),
        "windows_discarded": len(all_spans) - len(chosen.clean_spans),
        "disturbed": chosen.disturbed if disturbance else None,
    }


def measure_phases(
    endpoint: Endpoint,
    load: LoadSettings,
    params: dict,
    bodies_by_phase: dict[str, list[bytes]],
    process_groups: dict | None,
    fresh_workers: bool = False,
) -> dict:
    """The metrics of one point under a time-varying load (load.phases, one after the other): per phase and over
    the whole run, every request of a phase counted (a phase is measured as it comes, with whatever the server
    does in it: no stability windows). Each phase's `started_epoch_s` lets a reaction be timed against it."""

    def spec(phase) -> LoadSpec:
        return _phase_spec(endpoint, load, params, bodies_by_phase[phase.name], phase)

    ours = endpoint.metrics_url is not None
    warmup_s = load.warmup_s + (load.fresh_workers_warmup_s if fresh_workers else 0.0)
    if warmup_s > 0:
        run_load_processes(spec(load.phases[0]), warmup_s, load.client_processes)
    before = scrape(endpoint.metrics_url) if ours else {}
    sampler = ProcessSampler(process_groups) if process_groups else None
    if sampler:
        sampler.start()
    gpu = GpuUsageSampler().start()  # over every phase, as the server's CPU
    try:
        phases, everything = _run_phases(load, spec, endpoint.logs)
    finally:  # its thread ends with the load, also when it fails
        gpu_usage = gpu.stop()
    server_usage = sampler.stop() if sampler else {}
    after = scrape(endpoint.metrics_url) if ours else {}
    return {
        **protocol_of([body for bodies in bodies_by_phase.values() for body in bodies]),
        **_counted_columns(everything),  # every phase's requests
        "failures": merged([phase["failures"] for phase in phases]),
        "phases": phases,
        **(_server_columns(endpoint, before, after, len(everything.status), spec(load.phases[0]).url) if ours else {}),
        **_client_columns(everything, load.client_processes),
        "stable": None,  # phases are measured as they come, not until they settle
        "stall_cause": None,  # nor looked at for stalls
        "lost_answers": None,  # nor for lost answers (each phase's end leaves its own requests in flight)
        "lost_cause": None,
        "pruned": False,
        "windows": len(phases),
        "measured_window_throughputs_rps": [p["throughput_rps"] for p in phases],
        "warmup_s": warmup_s,
        **server_usage,
        # phases are measured as they come: every request counts, and so does the server's CPU over all of them
        **cpu_ms_per_request(cpu_s_of(server_usage.get("server_processes", {})), len(everything.status)),
        **gpu_usage,
    }


def _phase_spec(endpoint: Endpoint, load: LoadSettings, params: dict, bodies: list[bytes], phase) -> LoadSpec:
    rate = phase.request_rate_rps if phase.concurrency is None else None
    if phase.concurrency is None and phase.request_rate_rps is None:  # the point's own load
        rate = params.get("request_rate_rps")
    concurrency = phase.concurrency or (load.max_connections if rate else params.get("concurrency", load.max_connections))
    return _load_spec(endpoint, load, bodies, concurrency, rate, _protocol(params, bodies))


def _run_phases(load: LoadSettings, spec, logs: Path | None = None) -> tuple[list[dict], LoadResult]:
    """Load each phase in turn with spec(phase); (each phase's columns, every phase's requests as one result).
    `logs`: TorchServe's, read for each phase's failures."""
    phases, everything = [], LoadResult()
    for phase in load.phases:
        started_epoch_s = time.time()
        phase_spec, mark = spec(phase), LogMark(logs) if logs else None
        result = run_load_processes(phase_spec, phase.duration_s, load.client_processes)
        windows = [(a, min(a + load.window_s, phase.duration_s)) for a in _starts(phase.duration_s, load.window_s)]
        phases.append(
            {
                "phase": phase.name,
                "started_epoch_s": started_epoch_s,
                **_counted_columns(result),
                "failures": attributed(result, input_names(phase_spec.bodies), None, mark, load.timeout_s),
                # completions per load.window_s through the phase: how the rate moved in it (a move shows here)
                "window_throughputs_rps": [round(result.rate_rps(a, b), 2) for a, b in windows],
            }
        )
        everything.latency_ms += result.latency_ms
        everything.status += result.status
        everything.wall_s += result.wall_s
        everything.client_cpu_s += result.client_cpu_s
    return phases, everything


def _ok_latencies(result: LoadResult) -> list[float]:
    return [lat for lat, ok in zip(result.latency_ms, result.ok, strict=True) if ok]


def _request_columns(result: LoadResult, ok_latencies: list[float]) -> dict:
    """How many requests a run (or its measured windows) made over how long, and how they ended."""
    return {
        "duration_s": result.wall_s,
        "requests_ok": len(ok_latencies),
        "requests_failed": len(result.status) - len(ok_latencies),
        "failures_by_status": {k: v for k, v in result.status_counts().items() if not k.startswith("2")},
    }


def _counted_columns(result: LoadResult) -> dict:
    """Requests, throughput and latency of a run measured as it came: every request counted, over its whole time."""
    ok_latencies = _ok_latencies(result)
    return {
        **_request_columns(result, ok_latencies),
        "throughput_rps": len(ok_latencies) / result.wall_s if result.wall_s else 0.0,
        **latency_summary(ok_latencies),
    }


def protocol_of(bodies: list[bytes]) -> dict:
    """The protocol a point's bodies choose, and why, for its record: named inputs (a join member's,
    inputs.named_inputs) go over gRPC whatever the suite's protocol; {} for the others (the point's load.protocol)."""
    if any(getattr(body, "parts", None) for body in bodies):
        return {"protocol": "grpc", "protocol_reason": NAMED_INPUTS_REASON}
    return {}


def _protocol(params: dict, bodies: list[bytes]) -> str | None:
    return protocol_of(bodies).get("protocol", params.get("protocol"))


# Measured on TorchServe 0.12 (docs/benchmarking.md, members): a 1.15 MB join row as two form fields cost the frontend
# 39-41 CPU-ms a request, as one octet-stream body 4.0; over gRPC the row comes as the workflow hands it on
NAMED_INPUTS_REASON = "named inputs (a join's parents' answers): over gRPC one input each, the join's row in the workflow, no multipart"


def _load_spec(
    endpoint: Endpoint, load: LoadSettings, bodies: list[bytes], concurrency: int, rate_rps: float | None, protocol: str | None = None
) -> LoadSpec:
    url, path = endpoint.url, endpoint.path
    if protocol == "grpc":  # TorchServe's gRPC inference API serves models by name, not workflows or other servers
        if endpoint.grpc_url is None and endpoint.metrics_url is not None and path.startswith(MODEL_PATH):
            raise RuntimeFailure(f"{url}{path} is measured over gRPC and its TorchServe has none: remove enable_grpc=false from its config")
        if endpoint.grpc_url is None or not path.startswith(MODEL_PATH):
            raise RuntimeFailure(f"load.protocol grpc: TorchServe's gRPC inference API serves models, not {url}{path}; use http here")
        url, path = endpoint.grpc_url, path.removeprefix(MODEL_PATH)
    return LoadSpec(
        url=url,
        path=path,
        bodies=bodies,
        token=endpoint.token,
        headers=endpoint.headers,
        concurrency=concurrency,
        request_rate_rps=rate_rps,
        arrival=load.arrival,
        timeout_s=load.timeout_s,
    )


def _server_columns(endpoint: Endpoint, before: dict, after: dict, requests: int, url: str) -> dict:
    """TorchServe's per-request means and the handlers' stages between two scrapes (an endpoint of ours). Over gRPC
    (`url`) the means are unknown, not 0: TorchServe 0.12's GRPCJob counts neither ts_queue_latency_microseconds nor
    ts_inference_latency_microseconds (RestJob does)."""
    models = list(endpoint.models)
    means = per_request_ms(before, after, models, 0 if url.startswith("grpc:") else requests)
    return {**means, **stage_columns(handler_stages(before, after, models))}


def _client_columns(result, processes: int = 1) -> dict:
    """The load generator's own CPU over a run (all its processes): whether it, not the server, may have been the
    limit (any one process near a core of its own)."""
    client_cpu_pct = 100 * result.client_cpu_s / result.wall_s if result.wall_s else None
    return {
        "client_cpu_pct": client_cpu_pct,
        "client_cpu_ms_per_request": 1000 * result.client_cpu_s / max(len(result.status), 1),
        "client_saturated": bool(client_cpu_pct and client_cpu_pct / processes > CLIENT_SATURATED_PCT),
    }


def _starts(duration_s: float, window_s: float) -> list[float]:
    return [k * window_s for k in range(max(int(duration_s // window_s), 1))]


def worker_stage_columns(stages: dict[str, dict[str, float]]) -> dict:
    """The handlers' time per request, summed over the nodes a request passes, by what it is spent on: reading the
    rows out of TorchServe's batch, checking and decoding each body, staging it into the batch buffer, copying to and
    from the device, the forward pass, and answering (encoding and packing the response, setting its status); and
    all of it but the forward pass. With overlap the stages run side by side: their sum is work, not wall time."""
    if not stages:
        return {}

    def total(*names: str) -> float:
        return round(sum(s.get(name, 0.0) for s in stages.values() for name in names), 4)

    forward, predict = total("forward_ms"), total("predict_ms")
    columns = {
        "worker_read_ms": total("read_ms"),
        "worker_check_ms": total("decode_ms"),
        "worker_stage_ms": total("stage_ms"),
        "worker_copy_ms": total("copy_ms"),
        "worker_forward_ms": forward,
        "worker_answer_ms": total("encode_ms", "answer_ms"),
    }
    outside = columns["worker_read_ms"] + columns["worker_check_ms"] + columns["worker_stage_ms"] + columns["worker_answer_ms"]
    columns["worker_outside_forward_ms"] = round(outside + predict - forward, 4)
    return columns


def stage_columns(stages: dict[str, dict[str, float]]) -> dict:
    """Per-node stage times and bytes (nested, in the run JSON) and the bytes columns of the summary."""
    first = next(iter(stages.values()), {})
    return {
        "server_stages": stages,
        **worker_stage_columns(stages),
        # What the first node hands on: to the next node in a workflow, to the client otherwise.
        "bytes_out_per_request": first.get("response_bytes"),
        "bytes_device_to_host_per_request": sum(s.get("device_to_host_bytes", 0.0) for s in stages.values()) if stages else None,
    }


def process_groups(server, models: tuple[str, ...]) -> dict[str, list[int]]:
    """Server processes by role: the Java frontend, each worker ("<model>/<pid>"), the rest."""
    groups: dict[str, list[int]] = {}
    for model in models:
        for worker in server.describe(model).get("workers", []):
            if int(worker.get("pid") or -1) > 0:  # -1: a worker still starting
                groups[f"{model}/{worker['pid']}"] = [int(worker["pid"])]
    workers = {pid for pids in groups.values() for pid in pids}
    for pid in server.process_ids():
        if pid not in workers:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if Path(f"/proc/{pid}").exists() else b""
            groups.setdefault("frontend" if b"java" in cmdline.split(b"\0")[0] else "other", []).append(pid)
    return groups
