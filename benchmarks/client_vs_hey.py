"""segserve's load generator beside `hey` (rakyll/hey, Debian's package: `make hey`), on one server, alternating (#49).

    .venv/bin/python benchmarks/client_vs_hey.py [--suite benchmarks/serving_path.yaml] [--seconds 20] [--rounds 2]

Deploys the suite's first point (by default the seed's raw FP16 body, 688,128 bytes, to the seg handler with no
network, 128 connections), then in each round puts the same body on it for --seconds with segserve's client
(`load.client_processes` 1 and 2) and with hey (`-c` the same connections), one after the other. Per run: the 2xx
answers a second (hey's "Status code distribution", not its Requests/sec, which counts every answer), the client's
CPU-ms per request (psutil over the client's processes) and the frontend's and workers' (ProcessSampler). A client
that costs less leaves more of a small machine to the server; at one core per client process, 1000 / its CPU-ms per
request is the rate where it saturates.
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from segserve.archives.catalog import Catalog  # noqa: E402
from segserve.bench.run.deploy import Deployment  # noqa: E402
from segserve.bench.run.load import LoadSpec  # noqa: E402
from segserve.bench.run.load_processes import run_load_processes  # noqa: E402
from segserve.bench.run.measure import process_groups  # noqa: E402
from segserve.bench.run.suite_run import plan_points  # noqa: E402
from segserve.bench.suite.spec import load_suite  # noqa: E402
from segserve.serving.metrics import ProcessSampler, cpu_ms_per_request, cpu_s_of  # noqa: E402

STATUS_LINE = re.compile(r"\[(\d{3})\]\s+(\d+) responses")


def body_of(suite) -> bytes:
    import torch

    raw = suite.inputs[0].raw
    dtype = getattr(torch, raw.dtype)
    return torch.randn(*raw.shape, generator=torch.Generator().manual_seed(0)).to(dtype).numpy().tobytes()


def run_segserve(endpoint, body: bytes, connections: int, seconds: float, processes: int) -> tuple[int, float, float]:
    spec = LoadSpec(url=endpoint.url, path=endpoint.path, bodies=[body], token=endpoint.token, concurrency=connections)
    result = run_load_processes(spec, seconds, processes)
    ok = sum(1 for good in result.ok if good)
    # from the first request sent to the last answer: spawned processes start their load seconds after the run's clock
    return ok, max(result.end_s) - min(result.intended_s), result.client_cpu_s


def run_hey(endpoint, body: bytes, connections: int, seconds: float) -> tuple[int, float, float]:
    with tempfile.NamedTemporaryFile(suffix=".bin") as file:
        file.write(body)
        file.flush()
        command = ["hey", "-z", f"{seconds}s", "-c", str(connections), "-m", "POST", "-T", "application/octet-stream", "-D", file.name]
        command += ["-H", f"Authorization: Bearer {endpoint.token}", endpoint.url + endpoint.path]
        started = time.monotonic()
        child = psutil.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cpu_s = 0.0
        while child.poll() is None:  # its CPU while it runs (a reaped child has none left to read)
            try:
                times = child.cpu_times()
                cpu_s = times.user + times.system
            except psutil.Error:
                break
            time.sleep(0.1)
        out = child.stdout.read()
        wall_s = time.monotonic() - started
    if child.returncode != 0:
        raise SystemExit(f"hey failed ({child.returncode}):\n{out[-2000:]}")
    ok = sum(int(n) for status, n in STATUS_LINE.findall(out) if status.startswith("2"))
    return ok, wall_s, cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=str(ROOT / "benchmarks" / "serving_path.yaml"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--weights", default=str(ROOT / "weights" / "seg.pt"))
    args = parser.parse_args()
    catalog = Catalog(ROOT)
    suite = load_suite(Path(args.suite), catalog)
    point = plan_points(suite, catalog, Path(args.weights))[0]
    connections = point.params.get("concurrency", suite.load.max_connections)
    body = body_of(suite)
    deployment = Deployment(suite, catalog, Path(args.weights), log=lambda _: None)
    try:
        endpoint = deployment.deploy(point)
        groups = process_groups(deployment.server, endpoint.models)
        print(f"{point.target} {dict(point.params)}: {len(body):,}-byte body, {connections} connections, {args.seconds:.0f} s a run")
        run_segserve(endpoint, body, connections, 5, 1)  # warm: fresh workers, the frontend's JIT
        clients = {
            "segserve (1 process)": lambda: run_segserve(endpoint, body, connections, args.seconds, 1),
            "segserve (2 processes)": lambda: run_segserve(endpoint, body, connections, args.seconds, 2),
            "hey": lambda: run_hey(endpoint, body, connections, args.seconds),
        }
        print("| round | client | 2xx a second | client CPU-ms a request | frontend CPU-ms a request | workers CPU-ms a request |")
        print("|---|---|---|---|---|---|")
        for round_ in range(1, args.rounds + 1):
            for name, run in clients.items():
                sampler = ProcessSampler(groups)
                sampler.start()
                ok, wall_s, client_cpu_s = run()
                server = cpu_ms_per_request(cpu_s_of(sampler.stop()["server_processes"]), ok)
                print(
                    f"| {round_} | {name} | {ok / wall_s:.1f} | {1000 * client_cpu_s / max(ok, 1):.3f} "
                    f"| {server.get('frontend_cpu_ms_per_request')} | {server.get('workers_cpu_ms_per_request')} |",
                    flush=True,
                )
    finally:
        deployment.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
