"""`segserve profile TARGET`: where a served target's time goes, measured from outside its workers.

py-spy samples every worker of the target out of process (--nonblocking: a worker is never paused): a flame
graph SVG per worker, and a top-functions table (self and total share of the samples) from py-spy's raw
collapsed stacks. Each node (a workflow's node models, or the fused model) also writes one torch.profiler
trace of one batch (Chrome trace JSON; handlers/profiling.py). Everything goes to results/profiles/<UTC>/.

With --connections N (default 8) the command drives the target itself with the given images and measures the
profiler's own cost: throughput in the sampled span against the spans just before and after it.
"""

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psutil

from handlers.profiling import post_request, request_path
from segserve.errors import RuntimeFailure, UsageError
from segserve.serving.metrics import ProcessSampler

TOP_FUNCTIONS = 15
LINE_NUMBER = re.compile(r":\d+\)$")
TRACE_WAIT_S = 60
NOT_PYTHON = "not a Python process"


def torchserve_load(server, endpoint: str, bodies: list[bytes], connections: int):
    """A LoadSpec of `connections` on one of our TorchServe's inference endpoints (/predictions/seg …)."""
    from segserve.bench.run.load import LoadSpec

    return LoadSpec(server.url("inference"), endpoint, bodies, server.token("inference"), connections)


def py_spy() -> str:
    found = Path(sys.executable).parent / "py-spy"
    path = str(found) if found.exists() else shutil.which("py-spy")
    if not path:
        raise UsageError("py-spy is not installed: run `make setup` (or pip install py-spy)")
    return path


def workers_of(server, target) -> dict[str, list[int]]:
    """model → pids of its workers, from the management API."""
    found = {}
    for model in target.models:
        workers = server.describe(model).get("workers", [])
        found[model] = [int(w["pid"]) for w in workers if int(w.get("pid") or -1) > 0]
        if not found[model]:
            raise RuntimeFailure(f"{model} has no running worker to profile")
    return found


def start_samplers(pids: dict[str, list[int]], seconds: float, rate_hz: int, out: Path) -> list[tuple[str, int, subprocess.Popen, Path]]:
    """Two py-spy recorders per worker (py-spy writes one format per run): the flame graph and the raw stacks."""
    started = []
    for model, worker_pids in pids.items():
        for pid in worker_pids:
            for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
                path = out / f"{model.replace('/', '-')}-{pid}.{suffix}"  # a Ray replica's group: "<model>/<pid>"
                command = [py_spy(), "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(rate_hz)]
                command += ["--nonblocking", "--format", fmt, "--output", str(path)]
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                started.append((model, pid, process, path))
    return started


def finish_samplers(samplers, timeout_s: float) -> list[str]:
    """Wait for every recorder; the errors of those that failed (py-spy needs ptrace: root or CAP_SYS_PTRACE)."""
    errors = []
    for model, pid, process, path in samplers:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        if process.returncode != 0 or not path.exists():
            lines = output.strip().splitlines()
            said = next((line for line in lines if line.startswith("Error:")), lines[-1] if lines else "")  # not its backtrace
            if "failed to find python" in said.lower() or not _python_executable(pid):
                errors.append(f"{model} {pid}: {NOT_PYTHON} (py-spy: {said})")
            else:
                errors.append(f"py-spy on {model} worker {pid} failed ({process.returncode}): {said}")
    return errors


def _python_executable(pid: int) -> bool:
    """Whether the process runs a python executable (py-spy's wording for the others may change between versions)."""
    try:
        return Path(psutil.Process(pid).exe()).name.startswith("python")
    except psutil.Error:
        return True  # gone or unreadable: its py-spy error is a real one


def top_functions(raw_files: list[Path], limit: int = TOP_FUNCTIONS) -> list[dict]:
    """Functions (lines of one function counted together) by own share of the samples (the leaf frame), with their
    total share (anywhere on the stack)."""
    own, anywhere, samples = Counter(), Counter(), 0
    for frames, count in _stacks(raw_files):
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    return [
        {"function": frame, "self_pct": _pct(n, samples), "total_pct": _pct(anywhere[frame], samples), "samples": n}
        for frame, n in own.most_common(limit)
    ]


def handler_costs(raw_files: list[Path], limit: int = TOP_FUNCTIONS) -> list[dict]:
    """Where the worker's time goes in segserve's own code: each sample counted for the innermost frame in
    handlers/ (what a torch op or codec was called from); samples outside (TorchServe's loop) as their leaf."""
    cost, samples = Counter(), 0
    for frames, count in _stacks(raw_files):
        samples += count
        ours = [frame for frame in frames if "(handlers/" in frame]
        cost[ours[-1] if ours else f"outside handlers: {frames[-1]}"] += count
    return [{"function": frame, "pct": _pct(n, samples), "samples": n} for frame, n in cost.most_common(limit)]


def _stacks(raw_files: list[Path]):
    """(frames, count) of py-spy's raw collapsed stacks, each frame `function (file)` without its line number."""
    for path in raw_files:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [LINE_NUMBER.sub(")", frame) for frame in stack.split(";") if frame]
            if frames and count.isdigit():
                yield frames, int(count)


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def request_traces(run_dir: Path, models: list[str], out: Path) -> dict[str, Path]:
    traces = {}
    for model in models:
        trace = out / f"{model}.trace.json"
        post_request(run_dir, model, trace.resolve())
        traces[model] = trace
    return traces


def wait_for_traces(run_dir: Path, traces: dict[str, Path], timeout_s: float) -> list[str]:
    """Wait for each node's trace; a request no batch took (no traffic) is withdrawn and named."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(t.exists() for t in traces.values()):
        time.sleep(0.2)
    missing = []
    for model, trace in traces.items():
        if not trace.exists():
            request_path(run_dir, model).unlink(missing_ok=True)
            missing.append(f"no batch of {model} ran in {timeout_s:.0f}s: no torch.profiler trace (send traffic, or use --connections)")
    return missing


def profile(
    server,
    target,
    run_dir: Path,
    seconds: float,
    out_root: Path,
    bodies: list[bytes],
    connections: int,
    rate_hz: int,
    log=print,
    warm_s: float = 2.0,
) -> dict:
    """Sample the target's workers for `seconds` (under our own load when connections > 0), with a torch.profiler
    trace per node, and write the profile folder; returns its summary (also profile.json)."""
    spec = torchserve_load(server, target.endpoint, bodies, connections) if connections else None
    return record(target.name, workers_of(server, target), spec, seconds, out_root, rate_hz, log, run_dir, warm_s)


def record(
    name: str,
    pids: dict[str, list[int]],
    spec,
    seconds: float,
    out_root: Path,
    rate_hz: int,
    log=print,
    run_dir: Path | None = None,
    warm_s: float = 2.0,
) -> dict:
    """Sample every process in `pids` (group → pids: a TorchServe target's models, or a command target's executables)
    for `seconds` under `spec`'s load (None: none), with each process's CPU over the sampled span; a process py-spy
    cannot read (not Python: Triton's server binary, Ray's raylet) is named, not an error. With run_dir (one of our
    TorchServes), a torch.profiler trace per group. Writes the profile folder; returns its summary."""
    out = out_root / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    load = Background(spec, 3 * seconds + 120) if spec else None  # stopped by finish()
    spans = {}
    if load:
        load.start()
        time.sleep(warm_s)  # warm: connections open, batches full, a fresh server past its ramp
        spans["before"] = load.span(seconds)
    traces = request_traces(run_dir, list(pids), out) if run_dir else {}
    # under load the traced batch runs before the sampled span, not in it: a worker's first torch.profiler run
    # imports torch._dynamo (1.5 s alone on 2 cores; the workers leave it out at start), which stalled the span.
    # Without load, whatever traffic comes while the processes are sampled is traced.
    errors = wait_for_traces(run_dir, traces, 10 + seconds) if traces and load else []
    log(f"sampling {sum(map(len, pids.values()))} process(es) of {name} for {seconds:.0f}s: {pids}")
    usage = ProcessSampler(pids)
    usage.start()
    samplers = start_samplers(pids, seconds, rate_hz, out)
    started = load.now() if load else 0.0
    errors += finish_samplers(samplers, seconds + 60)
    cpu = {group: round(used["cpu_pct"], 1) for group, used in usage.stop()["server_processes"].items()}
    not_python = list(dict.fromkeys(e for e in errors if NOT_PYTHON in e))  # two recorders a process
    errors = [e for e in errors if NOT_PYTHON not in e]
    if load:
        spans["sampled"] = (started, load.now())
        spans["after"] = load.span(seconds)
    if traces and not load:
        errors += wait_for_traces(run_dir, traces, TRACE_WAIT_S)
    result = load.finish() if load else None
    summary = {
        "target": name,
        "workers": pids,
        "seconds": seconds,
        "rate_hz": rate_hz,
        "cpu_pct": cpu,  # of one core, over the sampled span, per group (py-spy's own cost included)
        "not_python": not_python,
        "flame_graphs": sorted(p.name for p in out.glob("*.svg")),
        "traces": sorted(p.name for p in traces.values() if p.exists()),
        "top_functions": {group: top_functions(list(out.glob(f"{group}-*.txt"))) for group in pids},
        "handler_costs": {group: handler_costs(list(out.glob(f"{group}-*.txt"))) for group in pids},
        "errors": errors,
    }
    if result is not None:
        rates = {span: result.rate_rps(*times) for span, times in spans.items()}
        unsampled = (rates["before"] + rates["after"]) / 2
        summary["throughput_rps"] = {span: round(rate, 2) for span, rate in rates.items()}
        summary["profiler_cost_pct"] = round(100 * (1 - rates["sampled"] / unsampled), 1) if unsampled else None
        summary["requests_failed"] = sum(not ok for ok in result.ok)
    (out / "profile.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(render(summary))
    summary["folder"] = str(out)
    return summary


def render(summary: dict) -> str:
    from segserve.bench.results.render import render_table

    lines = [f"# Profile of {summary['target']}", "", f"py-spy at {summary['rate_hz']} Hz for {summary['seconds']:.0f}s, every process:"]
    cpu = summary.get("cpu_pct", {})
    lines += [
        "",
        *(
            f"- {group}: pids {', '.join(map(str, pids))}" + (f"; {cpu[group]}% of a core while sampled" if group in cpu else "")
            for group, pids in summary["workers"].items()
        ),
    ]
    if summary.get("not_python"):
        lines += ["", "Not sampled (py-spy reads Python processes only; their CPU is above):", ""]
        lines += [f"- {e}" for e in summary["not_python"]]
    if "throughput_rps" in summary:
        rates = summary["throughput_rps"]
        lines += [
            "",
            f"Throughput {rates['before']} req/s before, {rates['sampled']} while sampled, {rates['after']} after: "
            f"the profiler's cost {summary['profiler_cost_pct']}% ({summary['requests_failed']} failed request(s)).",
        ]
    for model, rows in summary["handler_costs"].items():
        lines += ["", f"## {model}: where the time goes in segserve's handlers", "", render_table(rows) if rows else "(no samples)"]
        lines += ["", "Each sample counted for the innermost handlers/ frame on its stack (the op or codec it called runs inside)."]
    for model, rows in summary["top_functions"].items():
        lines += ["", f"## {model}: top functions by own samples", "", render_table(rows) if rows else "(no samples)"]
    lines += ["", "Flame graphs: " + ", ".join(summary["flame_graphs"]), "", "torch.profiler traces (chrome://tracing, Perfetto; "]
    lines[-1] += "*.ops.txt: the batch's ops by own CPU time): "
    lines[-1] += ", ".join(summary["traces"]) or "none"
    if summary["errors"]:
        lines += ["", "Errors:", "", *(f"- {e}" for e in summary["errors"])]
    return "\n".join(lines) + "\n"


class Background:
    """Closed-loop load in a thread, for the whole profile; spans are offsets in its own clock."""

    def __init__(self, spec, duration_s: float):
        self.spec, self.duration_s, self.result, self.error = spec, duration_s, None, None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from segserve.bench.run.load import run_load

        try:
            self.result = run_load(self.spec, self.duration_s, stop_early=lambda _: self.stopping.is_set(), check_every_s=0.5)
        except Exception as error:  # shown by finish()
            self.error = error

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def now(self) -> float:
        return time.monotonic() - self.started

    def span(self, seconds: float) -> tuple[float, float]:
        begin = self.now()
        time.sleep(seconds)
        return begin, self.now()

    def finish(self):
        self.stopping.set()
        self.thread.join()
        if self.error is not None:
            raise RuntimeFailure(f"the profile's load failed: {self.error}")
        return self.result
