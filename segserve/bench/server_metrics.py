"""Server-side numbers: TorchServe's Prometheus counters and the CPU/RSS of its processes."""

import re
import time

import psutil

from segserve.http import request

# Frontend counters (metrics_mode=prometheus), cumulative microseconds per model. Workflow nodes
# (seg_jpeg__seg, ...) have these but no ts_inference_requests_total, so the request count comes
# from the load generator: every request passes every model of its target once.
COUNTERS = ("ts_queue_latency_microseconds", "ts_inference_latency_microseconds")
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([-+0-9.eE]+)$")


def scrape(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(counter, model_name): value} from GET /metrics."""
    response = request(metrics_url, "GET", "/metrics", timeout_s=10)
    values: dict[tuple[str, str], float] = {}
    for line in response.text().splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1) in COUNTERS:
            model = re.search(r'model_name="([^"]*)"', match.group(2))
            if model:
                key = (match.group(1), model.group(1))
                values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def per_request_ms(before: dict, after: dict, models: list[str], requests: int) -> dict[str, float | None]:
    """Mean queue and inference time per request over the interval, summed over the models a request passes."""
    if requests <= 0:
        return {"server_queue_ms": None, "server_inference_ms": None}

    def mean_ms(counter: str) -> float:
        return sum(after.get((counter, m), 0) - before.get((counter, m), 0) for m in models) / requests / 1000

    return {
        "server_queue_ms": mean_ms("ts_queue_latency_microseconds"),
        "server_inference_ms": mean_ms("ts_inference_latency_microseconds"),
    }


class ProcessSampler:
    """CPU time and RSS of a set of processes between start() and stop()."""

    def __init__(self, pids: list[int]):
        self.processes = []
        for pid in pids:
            try:
                self.processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass

    def _cpu_s(self) -> float:
        total = 0.0
        for process in self.processes:
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    def start(self) -> None:
        self.started, self.cpu_start = time.monotonic(), self._cpu_s()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self.started
        rss = 0
        for process in self.processes:
            try:
                rss += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return {"server_cpu_pct": 100 * (self._cpu_s() - self.cpu_start) / wall, "server_rss_mb": rss / 2**20}
