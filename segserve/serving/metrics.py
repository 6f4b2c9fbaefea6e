"""Server-side numbers: TorchServe's Prometheus counters and the CPU/RSS of its processes."""

import re
import threading
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
    """CPU use and RSS of named groups of processes ({"frontend": [pid], "seg": [pid, ...]}) between start() and stop().

    With interval_s, a thread also samples each group's CPU time every interval_s, so that between(a, b) can give it
    over a part of the run (seconds since start(): the measured windows, not the warm-up)."""

    def __init__(self, groups: dict[str, list[int]], interval_s: float | None = None):
        self.groups: dict[str, list[psutil.Process]] = {}
        for name, pids in groups.items():
            for pid in pids:
                try:
                    self.groups.setdefault(name, []).append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []  # (s since start, CPU-s by group)
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

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

    def _sample(self) -> dict[str, float]:
        cpu = self._cpu_s()
        with self.lock:
            self.samples.append((time.monotonic() - self.started, cpu))
        return cpu

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self.started = time.monotonic()
        self.cpu_start = self._sample()
        if self.interval_s:
            self.thread = threading.Thread(target=self._loop, name="process-cpu", daemon=True)
            self.thread.start()

    def stop(self) -> dict:
        wall_s = time.monotonic() - self.started
        if self.thread:
            self.stopped.set()
            self.thread.join()
        cpu_end = self._sample()
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

    def between(self, spans: list[tuple[float, float]]) -> dict[str, float]:
        """CPU-s by group over the spans (seconds since start()), from the samples nearest their bounds; {} when the
        samples do not cover them."""
        with self.lock:
            samples = list(self.samples)
        if not spans or len(samples) < 2 or samples[-1][0] < max(b for _, b in spans) - (self.interval_s or 0.0):
            return {}
        totals = dict.fromkeys(self.groups, 0.0)
        for from_s, to_s in spans:
            first = min(samples, key=lambda s: abs(s[0] - from_s))[1]
            last = min(samples, key=lambda s: abs(s[0] - to_s))[1]
            for name in totals:
                totals[name] += last.get(name, 0.0) - first.get(name, 0.0)
        return totals


def cpu_ms_per_request(cpu_s_by_group: dict[str, float], requests: int, suffix: str = "") -> dict:
    """The server's CPU per request answered over one span, by role: the frontend (TorchServe's JVM), the workers
    (groups "<model>/<pid>"), both with the rest ("other"). cpu_s_by_group: {group: CPU-s} over that span."""
    if requests <= 0 or not cpu_s_by_group:
        return {}

    def ms(names) -> float:
        return round(1000 * sum(cpu_s_by_group[name] for name in names) / requests, 3)

    return {
        f"frontend_cpu_ms_per_request{suffix}": ms([n for n in cpu_s_by_group if n == "frontend"]),
        f"workers_cpu_ms_per_request{suffix}": ms([n for n in cpu_s_by_group if "/" in n]),
        f"server_cpu_ms_per_request{suffix}": ms(list(cpu_s_by_group)),
    }


def cpu_s_of(server_processes: dict) -> dict[str, float]:
    """{group: CPU-s} of ProcessSampler.stop()'s server_processes (the whole run)."""
    return {name: group["cpu_s"] for name, group in server_processes.items()}
