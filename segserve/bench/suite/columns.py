"""What a benchmark run point records: the columns, and each metric's unit and direction.

One table for every metric (tag, unit, direction), used by constraints, the
objective, the report and `bench compare`. Records are flat dicts with units
in the names; `summary.csv` has one row per run point.
"""

from dataclasses import dataclass
from typing import TypedDict


@dataclass(frozen=True)
class Metric:
    tag: str
    unit: str
    higher_is_better: bool
    description: str


METRICS = {
    m.tag: m
    for m in [
        Metric("throughput_rps", "req/s", True, "successful responses per second in the measured windows"),
        Metric("throughput_ci_low_rps", "req/s", True, "low end of the 95% interval of the mean window throughput"),
        Metric("throughput_ci_high_rps", "req/s", True, "high end of the 95% interval of the mean window throughput"),
        Metric("latency_mean_ms", "ms", False, "mean latency of successful requests"),
        Metric("latency_p50_ms", "ms", False, "median latency"),
        Metric("latency_p90_ms", "ms", False, "90th percentile latency"),
        Metric("latency_p99_ms", "ms", False, "99th percentile latency"),
        Metric("latency_max_ms", "ms", False, "slowest successful request"),
        Metric("requests_ok", "requests", True, "successful requests measured"),
        Metric("requests_failed", "requests", False, "failed requests measured (any non-2xx status, timeout, connection error)"),
        Metric("stalled_s", "s", False, "load time (warm-up included) in which requests waited and none completed (bench/run/stalls.py)"),
        Metric("server_queue_ms", "ms", False, "mean time a request waited in TorchServe's queue (Prometheus)"),
        Metric("server_inference_ms", "ms", False, "mean time from dequeue to response in the frontend (Prometheus)"),
        Metric("client_cpu_pct", "% of one core", False, "load generator CPU use during measurement"),
        Metric("client_cpu_ms_per_request", "ms", False, "load generator CPU time per request"),
        Metric("server_cpu_pct", "% of one core", False, "frontend + workers CPU use during measurement (psutil)"),
        Metric("server_rss_mb", "MB", False, "frontend + workers resident memory at the end of measurement"),
        Metric("frontend_cpu_ms_per_request", "ms", False, "the frontend's (JVM) CPU time per request answered (psutil, measured windows)"),
        Metric("workers_cpu_ms_per_request", "ms", False, "the workers' CPU time per request answered (psutil, measured windows)"),
        Metric("server_cpu_ms_per_request", "ms", False, "frontend + workers + the rest, CPU time per request answered (measured windows)"),
        Metric("server_cpu_ms_per_request_whole_run", "ms", False, "the same over the whole load run (warm-up and JIT compiles in it)"),
        Metric("worker_read_ms", "ms", False, "handlers: taking each request's body out of TorchServe's batch, per request"),
        Metric("worker_check_ms", "ms", False, "handlers: reading, checking and decoding each body (the decode hook), per request"),
        Metric("worker_stage_ms", "ms", False, "handlers: writing the rows into the batch buffer (the prepare hook), per request"),
        Metric("worker_copy_ms", "ms", False, "handlers: host↔device copies, waiting for the GPU included (GPU only), per request"),
        Metric("worker_forward_ms", "ms", False, "handlers: the forward pass and argmax (on a GPU: its launches), per request"),
        Metric("worker_answer_ms", "ms", False, "handlers: encoding and packing the answers, setting statuses, per request"),
        Metric("worker_outside_forward_ms", "ms", False, "handlers: everything but the forward pass, per request (stages summed)"),
        Metric("gpu_util_mean_pct", "%", True, "mean share of time a kernel ran on the GPUs in the measured windows (NVML; GPUs averaged)"),
        Metric("gpu_util_max_pct", "%", True, "highest GPU utilisation sampled in the measured windows (NVML, every 0.1 s)"),
        Metric("gpu_memory_util_mean_pct", "%", True, "mean share of time GPU memory was read or written in the measured windows (NVML)"),
        Metric("gpu_memory_used_max_mib", "MiB", False, "most GPU memory in use in the measured windows (NVML: every process, every GPU)"),
        Metric("gpu_samples", "samples", True, "NVML readings the GPU columns come from"),
        Metric("reconfigure_s", "s", False, "time spent restarting, registering or scaling before this point"),
        Metric("bytes_out_per_request", "bytes", False, "what the first node sends on per request (to the next node in a workflow)"),
        Metric("bytes_device_to_host_per_request", "bytes", False, "device→host bytes per request (GPU only; the class map or JPEG)"),
        Metric("warmup_s", "s", False, "warm-up time before measurement"),
        Metric("others_cpu_pct", "% of the machine", False, "most CPU other processes took in a measured window (/proc/stat)"),
        Metric("bare_forward_ips", "img/s", True, "seg points: bare forward at the same device, batch, threads and input, right after"),
        Metric("ratio_bare", "×", True, "seg points: median window throughput / median bare slice (before and after the point)"),
        Metric("bare_others_cpu_pct", "% of the machine", False, "seg points: most CPU other processes took in a bare-forward slice"),
        Metric("iou", "IoU", True, "optimised points: foreground IoU of the served network on held-out synthetic images"),
        Metric("iou_eager", "IoU", True, "optimised points: the eager fp32 network's IoU on the same images"),
        Metric("agreement", "share", True, "optimised points: share of pixels classed as the eager fp32 network classes them"),
        Metric("load_s", "s", False, "registration until every worker was ready: model load, compile and warm-up"),
        Metric("autoscaler_cpu_pct", "% of one core", False, "autoscaled points: the autoscaler's own CPU use while measured"),
        Metric("autoscaler_moves", "moves", False, "autoscaled points: workers moved (scale calls applied) while measured"),
        Metric("predicted_throughput_rps", "req/s", True, "auto search: the throughput its members predicted, before measuring"),
    ]
}


# Columns every summary row has, in order (DESIGN.md); swept parameters follow them.
class Record(TypedDict, total=False):
    """A measured point, as runs/<run_id>.json, summary.jsonl, a shared study and the sinks hold it: the keys every
    record has (the base columns below, its identity and outcome), typed; beside them one key per parameter of the
    point (bench/suite/params.py: `<node>_<param>` for a node's own) and the metrics of METRICS, which are these
    same names with the units in them."""

    run_id: str
    target: str
    engine: str  # what served it: torchserve or ray (grid.server.engine); a record from before the Ray engine has none
    point_key: str  # the point's place in the space, whatever else it was measured with
    workers: int | None
    batch_size: int | None
    max_batch_delay_ms: int | None
    concurrency: int | None
    request_rate_rps: float | None
    duration_s: float
    requests_ok: int
    requests_failed: int
    throughput_rps: float | None  # None: no request answered (the point's error says why)
    latency_mean_ms: float | None
    latency_p50_ms: float | None
    latency_p90_ms: float | None
    latency_p99_ms: float | None
    latency_max_ms: float | None
    server_queue_ms: float | None
    client_cpu_pct: float | None
    reconfigure_s: float
    error: str | None  # why the point failed; None for a measurement
    # its failed requests by status, input and node, a sample answer of each kind (bench/run/failures.py); None: none
    failures: dict | None
    # a workflow's answers its executor never received, by node (bench/run/lost_answers.py); None: not a workflow
    lost_answers: dict[str, int] | None
    # the spec values a workflow point's .war copy changed, as TorchServe registers them ({"models.timeout-ms": 5000,
    # "models.<node>.retry-attempts": 1, …}: registration.spec_overrides); None: not a .war
    archive_overrides: dict[str, int] | None
    environment: dict  # the machine it was measured on (segserve/machine/identity.py)
    measured_windows_s: list[list[float]]  # the windows the numbers come from, [start, end] in s since the load started
    # a Ray point on a user's cluster (`bench run --ray-address`, bench/run/deploy.py's ClusterNodes): its alive nodes,
    # each node's cores, our models' running replicas per node, and each node's busy share of its cores over the
    # measured windows (%, read on the node by an actor of ours: engines/ray/node_usage.py); keyed by node IP
    ray_nodes: int
    node_cores: dict[str, int]
    replicas_per_node: dict[str, int]
    node_cpu_pct: dict[str, float | None]
    # why server_cpu_ms_per_request is None there: the nodes' processes are out of this host's process tree
    server_cpu_unavailable: str


BASE_COLUMNS = [
    "run_id",
    "target",
    "engine",
    "workers",
    "batch_size",
    "max_batch_delay_ms",
    "concurrency",
    "request_rate_rps",
    "duration_s",
    "requests_ok",
    "requests_failed",
    "throughput_rps",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "server_queue_ms",
    "client_cpu_pct",
]
EXTRA_COLUMNS = [
    "throughput_ci_low_rps",
    "throughput_ci_high_rps",
    "server_inference_ms",
    "bytes_out_per_request",
    "bytes_device_to_host_per_request",
    "client_cpu_ms_per_request",
    "client_saturated",
    "stable",
    "pruned",
    "windows",
    "disturbed",
    "stalled",
    "stalled_s",
    "others_cpu_pct",
    "server_cpu_pct",
    "server_rss_mb",
    "frontend_cpu_ms_per_request",
    "workers_cpu_ms_per_request",
    "server_cpu_ms_per_request",
    "server_cpu_ms_per_request_whole_run",
    "worker_read_ms",
    "worker_check_ms",
    "worker_stage_ms",
    "worker_copy_ms",
    "worker_forward_ms",
    "worker_answer_ms",
    "worker_outside_forward_ms",
    "gpu_util_mean_pct",
    "gpu_util_max_pct",
    "gpu_memory_util_mean_pct",
    "gpu_memory_used_max_mib",
    "gpu_samples",
    "gpu_usage_unavailable",
    "reconfigure_s",
    "warmup_s",
    "bare_forward_ips",
    "bare_device",
    "ratio_bare",
    "ratio_bare_ci_low",
    "ratio_bare_ci_high",
    "suspect",
    "bare_disturbed",
    "bare_others_cpu_pct",
    "ratio_bare_uncertain",
    "predicted_throughput_rps",
    "autoscaler_moves",
    "autoscaler_cpu_pct",
    "load_s",
    "iou",
    "iou_eager",
    "agreement",
    "accurate",
    "valid",
    "invalid_reason",
    "error",
    "error_cause",  # the root cause of a failed point or of its failed requests (the workers' first exception)
    "stall_cause",  # how long the point stalled and the node whose timeout-ms TorchServe waited (bench/run/stalls.py)
    "lost_answers",  # a workflow's: {node: its answers the executor never received} (bench/run/lost_answers.py)
    "lost_cause",  # those lost answers (or requests past the client's timeout) and the timeout-ms they wait, in words
    "archive_overrides",  # a workflow's: {"models.timeout-ms": 5000, …}, what its .war copy changed (the user's file never)
]


def satisfies(record: dict, constraints: dict[str, dict[str, float]]) -> bool:
    """True when every constrained metric is present and within {min, max}; failed runs, invalid points (an
    optimisation that failed the accuracy gate) and stalled ones (requests waited with none answered: the rate is
    not what the configuration serves) never satisfy."""
    if record.get("error") or record.get("valid") is False or record.get("stalled"):
        return False
    for tag, bounds in constraints.items():
        value = record.get(tag)
        if value is None:
            return False
        if "max" in bounds and value > bounds["max"]:
            return False
        if "min" in bounds and value < bounds["min"]:
            return False
    return True


def best(records: list[dict], constraints: dict[str, dict[str, float]], objective: str) -> dict | None:
    """The record that satisfies the constraints with the best objective value, or None."""
    feasible = [r for r in records if satisfies(r, constraints) and r.get(objective) is not None]
    if not feasible:
        return None
    sign = 1 if METRICS[objective].higher_is_better else -1
    return max(feasible, key=lambda r: sign * r[objective])
