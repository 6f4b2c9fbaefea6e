"""Server-side numbers: TorchServe's Prometheus counters and the CPU/RSS of its processes."""

import re
import time

import psutil

from segserve.serving.http import request

# Frontend counters (metrics_mode=prometheus), cumulative microseconds per model. Workflow nodes
# (seg_jpeg__seg, ...) have these but no ts_inference_requests_total, so the request count comes
# from the load generator: every request passes every model of its target once.
COUNTERS = ("ts_queue_latency_microseconds", "ts_inference_latency_microseconds")
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([-+0-9.eE]+)$")


# The handlers' own cumulative counters (handlers/base.py: report_metrics), labelled ModelName.
HANDLER_PREFIX = "Segserve"


def scrape(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(counter, model_name): value} from GET /metrics: the frontend's and the handlers' counters."""
    response = request(metrics_url, "GET", "/metrics", timeout_s=10)
    values: dict[tuple[str, str], float] = {}
    for line in response.text().splitlines():
        match = SAMPLE.match(line)
        if match and (match.group(1) in COUNTERS or match.group(1).startswith(HANDLER_PREFIX)):
            model = re.search(r'(?:model_name|ModelName)="([^"]*)"', match.group(2))
            if model:
                key = (match.group(1), model.group(1))
                values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def per_request_ms(before: dict, after: dict, models: list[str], requests: int) -> dict:
    """Mean queue and inference time per request over the interval: summed over the models a request
    passes (the record's columns) and per model (`server_models`, where the time goes in a workflow)."""
    if requests <= 0:
        return {"server_queue_ms": None, "server_inference_ms": None, "server_models": {}}

    def mean_ms(counter: str, model: str) -> float:
        return (after.get((counter, model), 0) - before.get((counter, model), 0)) / requests / 1000

    per_model = {
        m: {"queue_ms": mean_ms("ts_queue_latency_microseconds", m), "inference_ms": mean_ms("ts_inference_latency_microseconds", m)}
        for m in models
    }
    return {
        "server_queue_ms": sum(v["queue_ms"] for v in per_model.values()),
        "server_inference_ms": sum(v["inference_ms"] for v in per_model.values()),
        "server_models": per_model,
    }


def handler_stages(before: dict, after: dict, models: list[str]) -> dict[str, dict[str, float]]:
    """Per model: each Segserve* counter's increase per request the handler served (ms per stage, bytes)."""
    stages = {}
    for model in models:
        delta = {
            name[len(HANDLER_PREFIX) :]: value - before.get((name, m), 0.0)
            for (name, m), value in after.items()
            if m == model and name.startswith(HANDLER_PREFIX)
        }
        served = delta.pop("Requests", 0.0)
        if served > 0:
            stages[model] = {_snake(name): value / served for name, value in delta.items()}
    return stages


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


class ProcessSampler:
    """CPU use and RSS of named groups of processes ({"frontend": [pid], "seg": [pid, ...]}) between start() and stop()."""

    def __init__(self, groups: dict[str, list[int]]):
        self.groups: dict[str, list[psutil.Process]] = {}
        for name, pids in groups.items():
            for pid in pids:
                try:
                    self.groups.setdefault(name, []).append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass

    def _cpu_s(self) -> dict[str, float]:
        totals = {}
        for name, processes in self.groups.items():
            totals[name] = 0.0
            for process in processes:
                try:
                    times = process.cpu_times()
                    totals[name] += times.user + times.system
                except psutil.NoSuchProcess:
                    pass
        return totals

    def start(self) -> None:
        self.started, self.cpu_start = time.monotonic(), self._cpu_s()

    def stop(self) -> dict:
        wall_s = time.monotonic() - self.started
        cpu_end = self._cpu_s()
        per_group = {}
        for name, processes in self.groups.items():
            rss = 0
            for process in processes:
                try:
                    rss += process.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            cpu_s = cpu_end[name] - self.cpu_start[name]
            per_group[name] = {"cpu_pct": 100 * cpu_s / wall_s, "cpu_s": cpu_s, "rss_mb": rss / 2**20}
        return {
            "server_cpu_pct": sum(g["cpu_pct"] for g in per_group.values()),
            "server_rss_mb": sum(g["rss_mb"] for g in per_group.values()),
            "server_processes": per_group,
        }


def cpu_ms_per_request(server_processes: dict, requests: int) -> dict:
    """The server's CPU per request answered over the same span (the whole load run, warm-up included), by role:
    the frontend (TorchServe's JVM), the workers (groups "<model>/<pid>"), both with the rest ("other")."""
    if requests <= 0 or not server_processes:
        return {}

    def ms(names) -> float:
        return round(1000 * sum(server_processes[name]["cpu_s"] for name in names) / requests, 3)

    return {
        "frontend_cpu_ms_per_request": ms([n for n in server_processes if n == "frontend"]),
        "workers_cpu_ms_per_request": ms([n for n in server_processes if "/" in n]),
        "server_cpu_ms_per_request": ms(list(server_processes)),
    }
